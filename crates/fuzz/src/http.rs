//! HTTP door targets: cursors, the OCI JSON bodies, and the `Signature` Authorization header.

use tributary_http::fuzzing::{
    create_cursor, create_group_cursor, decode_cursor, parse_signature, put_messages, sign_cursor,
    update_group,
};

/// A cursor: the payload after the first byte signed with the test key (first byte even), so the
/// strict payload reader is reached, or the bytes as cursor text (odd). An accepted cursor is
/// re-issued as exactly the same text: the encoding is canonical.
pub fn cursor(data: &[u8]) {
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    let text = if choice % 2 == 0 {
        sign_cursor(rest)
    } else {
        match std::str::from_utf8(rest) {
            Ok(text) => text.to_owned(),
            Err(_) => return,
        }
    };
    if let Ok(reissued) = decode_cursor(&text, i64::MIN) {
        assert_eq!(reissued, text, "a cursor is re-issued as it was");
    }
}

/// A request body for PutMessages, CreateCursor, CreateGroupCursor or UpdateGroup (chosen by the
/// first byte), decoded as the handler does before it touches the broker.
pub fn json(data: &[u8]) {
    let Some((&choice, body)) = data.split_first() else {
        return;
    };
    match choice % 4 {
        0 => {
            if let Ok(messages) = put_messages(body) {
                assert!(!messages.is_empty(), "a put carries at least one message");
            }
        }
        1 => drop(create_cursor(body)),
        2 => drop(create_group_cursor(body)),
        _ => drop(update_group(body)),
    }
}

/// An `Authorization: Signature …` value. What parses, written back in the canonical form,
/// parses to the same key id, headers and signature.
pub fn signature(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok((key_id, headers, signature)) = parse_signature(text) else {
        return;
    };
    assert!(!key_id.is_empty());
    assert!(!signature.is_empty());
    if headers.is_empty() {
        // `headers=" "` names no header; the verifier refuses it for the headers it requires.
        return;
    }
    let again = format!(
        "Signature version=\"1\",keyId=\"{key_id}\",algorithm=\"rsa-sha256\",headers=\"{}\",signature=\"{signature}\"",
        headers.join(" ")
    );
    assert_eq!(
        parse_signature(&again),
        Ok((key_id, headers, signature)),
        "{again}"
    );
}
