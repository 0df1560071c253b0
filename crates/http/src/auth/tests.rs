//! Signatures made the way the OCI SDK makes them, verified; anything changed, refused.

use std::sync::OnceLock;

use axum::http::HeaderValue;
use rsa::RsaPrivateKey;
use rsa::pkcs1v15::SigningKey;
use rsa::pkcs8::EncodePublicKey;
use rsa::signature::{SignatureEncoding, Signer};
use tributary_event::ManualClock;

use super::*;

const KEY_ID: &str = "ocid1.tenancy.oc1..aaaatest/ocid1.user.oc1..aaaatest/aa:aa:aa:aa:aa:aa:aa:aa:aa:aa:aa:aa:aa:aa:aa:aa";
const NOW_MS: i64 = 1_700_000_000_000;

fn private_key() -> &'static RsaPrivateKey {
    static KEY: OnceLock<RsaPrivateKey> = OnceLock::new();
    KEY.get_or_init(|| RsaPrivateKey::new(&mut rand::thread_rng(), 2048).unwrap())
}

fn verifier(dir: &Path) -> Verifier {
    let pem = private_key()
        .to_public_key()
        .to_public_key_pem(Default::default())
        .unwrap();
    let path = dir.join("oci-api-keys.json");
    crate::write_key_file(
        &path,
        serde_json::json!({ KEY_ID: pem }).to_string().as_bytes(),
    )
    .unwrap();
    Verifier::load(path, Arc::new(ManualClock::new(NOW_MS)), 300_000).unwrap()
}

fn http_date(ms: i64) -> String {
    httpdate::fmt_http_date(SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(ms as u64))
}

/// Signs like `oci.signer.Signer`: the listed headers, in order.
fn signed(method: &Method, target: &str, body: &[u8], names: &[&str]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let put = |h: &mut HeaderMap, k: &'static str, v: String| {
        h.insert(k, HeaderValue::from_str(&v).unwrap());
    };
    put(&mut headers, "date", http_date(NOW_MS - 1000));
    put(&mut headers, "host", "127.0.0.1:8080".into());
    put(&mut headers, "content-type", "application/json".into());
    put(&mut headers, "content-length", body.len().to_string());
    put(
        &mut headers,
        "x-content-sha256",
        STANDARD.encode(Sha256::digest(body)),
    );
    sign(&mut headers, method, target, names);
    headers
}

fn sign(headers: &mut HeaderMap, method: &Method, target: &str, names: &[&str]) {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let text = signing_string(&names, method, target, headers).unwrap();
    let signature = SigningKey::<Sha256>::new(private_key().clone()).sign(text.as_bytes());
    let value = format!(
        "Signature algorithm=\"rsa-sha256\",headers=\"{}\",keyId=\"{KEY_ID}\",signature=\"{}\",version=\"1\"",
        names.join(" "),
        STANDARD.encode(signature.to_bytes())
    );
    headers.insert("authorization", HeaderValue::from_str(&value).unwrap());
}

const GET_HEADERS: &[&str] = &["date", "(request-target)", "host"];
const BODY_HEADERS: &[&str] = &[
    "date",
    "(request-target)",
    "host",
    "content-length",
    "content-type",
    "x-content-sha256",
];

#[test]
fn sdk_style_signatures_verify() {
    let dir = tempfile::tempdir().unwrap();
    let v = verifier(dir.path());
    let target = "/20180418/streams/s/messages?cursor=abc&limit=10";
    let h = signed(&Method::GET, target, b"", GET_HEADERS);
    assert_eq!(
        v.verify(&Method::GET, target, &h, b"", true).unwrap(),
        KEY_ID
    );
    let body = br#"{"partition":"0","type":"LATEST"}"#;
    let target = "/20180418/streams/s/cursors";
    let h = signed(&Method::POST, target, body, BODY_HEADERS);
    v.verify(&Method::POST, target, &h, body, true).unwrap();
    // PutMessages: the SDK signs only date, (request-target) and host.
    let h = signed(
        &Method::POST,
        "/20180418/streams/s/messages",
        body,
        GET_HEADERS,
    );
    v.verify(
        &Method::POST,
        "/20180418/streams/s/messages",
        &h,
        body,
        false,
    )
    .unwrap();
    assert!(
        v.verify(
            &Method::POST,
            "/20180418/streams/s/messages",
            &h,
            body,
            true
        )
        .is_err()
    );
}

#[test]
fn anything_changed_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let v = verifier(dir.path());
    let target = "/20180418/streams/s/cursors";
    let body = br#"{"partition":"0","type":"LATEST"}"#;
    let h = signed(&Method::POST, target, body, BODY_HEADERS);
    let refused = |m: &Method, t: &str, h: &HeaderMap, b: &[u8]| {
        let e = v.verify(m, t, h, b, true).unwrap_err();
        assert_eq!(e.status, 401, "{e:?}");
    };
    refused(&Method::POST, "/20180418/streams/other/cursors", &h, body);
    refused(&Method::PUT, target, &h, body);
    refused(
        &Method::POST,
        target,
        &h,
        br#"{"partition":"1","type":"LATEST"}"#,
    );
    let mut other_host = h.clone();
    other_host.insert("host", HeaderValue::from_static("evil:1"));
    refused(&Method::POST, target, &other_host, body);
    let mut unknown_key = h.clone();
    let auth = h["authorization"]
        .to_str()
        .unwrap()
        .replace("aaaatest/", "bbbbtest/");
    unknown_key.insert("authorization", HeaderValue::from_str(&auth).unwrap());
    refused(&Method::POST, target, &unknown_key, body);
    let mut bad_signature = h.clone();
    let auth = h["authorization"]
        .to_str()
        .unwrap()
        .replace("signature=\"", "signature=\"AAAA");
    bad_signature.insert("authorization", HeaderValue::from_str(&auth).unwrap());
    refused(&Method::POST, target, &bad_signature, body);
    let mut unsigned = h.clone();
    unsigned.remove("authorization");
    refused(&Method::POST, target, &unsigned, body);
    // A body request that does not sign its body headers.
    let partial = signed(&Method::POST, target, body, GET_HEADERS);
    refused(&Method::POST, target, &partial, body);
}

#[test]
fn the_date_must_be_within_the_skew() {
    let dir = tempfile::tempdir().unwrap();
    let v = verifier(dir.path());
    let target = "/20180418/streams/s/groups/g";
    for (offset_ms, ok) in [
        (-299_000, true),
        (299_000, true),
        (-301_000, false),
        (301_000, false),
    ] {
        let mut h = signed(&Method::GET, target, b"", GET_HEADERS);
        h.insert(
            "date",
            HeaderValue::from_str(&http_date(NOW_MS + offset_ms)).unwrap(),
        );
        sign(&mut h, &Method::GET, target, GET_HEADERS);
        assert_eq!(
            v.verify(&Method::GET, target, &h, b"", true).is_ok(),
            ok,
            "{offset_ms}"
        );
    }
}

#[test]
fn keys_added_later_are_picked_up() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("oci-api-keys.json");
    crate::write_key_file(&path, b"{}").unwrap();
    let v = Verifier::load(path.clone(), Arc::new(ManualClock::new(NOW_MS)), 300_000).unwrap();
    let target = "/20180418/streams/s/groups/g";
    let h = signed(&Method::GET, target, b"", GET_HEADERS);
    assert!(v.verify(&Method::GET, target, &h, b"", true).is_err());
    std::thread::sleep(std::time::Duration::from_millis(20));
    let pem = private_key()
        .to_public_key()
        .to_public_key_pem(Default::default())
        .unwrap();
    crate::write_key_file(
        &path,
        serde_json::json!({ KEY_ID: pem }).to_string().as_bytes(),
    )
    .unwrap();
    v.verify(&Method::GET, target, &h, b"", true).unwrap();
}

#[test]
fn bad_key_files_fail_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys.json");
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(0));
    assert!(
        Verifier::load(path.clone(), clock.clone(), 1).is_err(),
        "missing"
    );
    crate::write_key_file(&path, b"[]").unwrap();
    assert!(
        Verifier::load(path.clone(), clock.clone(), 1).is_err(),
        "not an object"
    );
    crate::write_key_file(&path, br#"{"k": "not a pem"}"#).unwrap();
    assert!(Verifier::load(path, clock, 1).is_err(), "not a key");
}

#[test]
#[cfg(unix)]
fn a_key_file_readable_by_others_is_refused_at_start_and_at_reload() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("oci-api-keys.json");
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(0));
    // Written the usual way (umask 022): readable by everyone.
    std::fs::write(&path, "{}").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let error = Verifier::load(path.clone(), clock.clone(), 1).unwrap_err();
    let text = error.to_string();
    assert!(
        matches!(error, KeyFileError::Exposed { mode: 0o644, .. }),
        "{text}"
    );
    assert!(
        text.contains(&format!("run `chmod 600 {}`", path.display())),
        "{text}"
    );
    crate::write_key_file(&path, b"{}").unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "write_key_file fixes the mode");
    Verifier::load(path, clock, 1).unwrap();
}

#[test]
fn debug_output_never_shows_a_signature() {
    let params = SignatureParams::parse(
        r#"Signature keyId="t/u/f",algorithm="rsa-sha256",headers="date",signature="c2VjcmV0LXNpZw==""#,
    )
    .unwrap();
    let shown = format!("{params:?}");
    assert!(!shown.contains("c2VjcmV0LXNpZw"), "{shown}");
    assert!(shown.contains("t/u/f"), "{shown}");
}

#[test]
fn authorization_parameters_parse_strictly() {
    let ok = SignatureParams::parse(
        r#"Signature version="1",keyId="t/u/f",algorithm="rsa-sha256",headers="date (request-target) host",signature="c2ln""#,
    )
    .unwrap();
    assert_eq!(ok.key_id, "t/u/f");
    assert_eq!(ok.headers, vec!["date", "(request-target)", "host"]);
    for bad in [
        "",
        "Basic dXNlcjpwYXNz",
        r#"Signature keyId="a",keyId="b",headers="date",signature="x""#,
        r#"Signature keyId="a",headers="date",signature="x",extra="y""#,
        r#"Signature keyId="a",headers="date",signature="x",algorithm="hmac-sha256""#,
        r#"Signature keyId="a",headers="date""#,
        r#"Signature keyId=a,headers="date",signature="x""#,
        r#"Signature keyId="a,headers="date",signature="x""#,
    ] {
        assert!(SignatureParams::parse(bad).is_err(), "{bad}");
    }
}
