//! Reading one page of a List Blobs answer (`restype=container&comp=list&include=metadata`):
//! each blob's name, ETag, Last-Modified and metadata, and the marker of the next page.
//!
//! Only the elements callers use are read; anything else (other properties, unknown
//! elements a newer service version adds) is skipped. Malformed XML is an error, never a panic.

use std::collections::HashMap;

use quick_xml::Reader;
use quick_xml::events::Event;

/// One blob of a listing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListedBlob {
    /// The blob's name in its container.
    pub name: String,
    /// The ETag, without surrounding quotes.
    pub etag: String,
    /// The RFC 1123 date as the service wrote it.
    pub last_modified: String,
    /// Keys in lower case (metadata keys are case-insensitive).
    pub metadata: HashMap<String, String>,
    /// The size in bytes (0 for a blob that has only uncommitted blocks).
    pub content_length: u64,
}

/// One page: its blobs and, when there are more, the marker to ask for next.
#[derive(Debug, Default)]
pub struct Page {
    /// The page's blobs, in name order.
    pub blobs: Vec<ListedBlob>,
    /// The marker of the next page; `None` on the last.
    pub next_marker: Option<String>,
}

/// Parses a List Blobs response body.
pub(crate) fn parse(xml: &str) -> Result<Page, String> {
    let mut reader = Reader::from_str(xml);
    let mut path: Vec<String> = Vec::new();
    let mut page = Page::default();
    let mut blob = ListedBlob::default();
    loop {
        match reader
            .read_event()
            .map_err(|e| format!("bad listing XML: {e}"))?
        {
            Event::Start(start) => {
                let name = String::from_utf8_lossy(start.local_name().as_ref()).into_owned();
                if name == "Blob" {
                    blob = ListedBlob::default();
                }
                path.push(name);
            }
            Event::End(_) => {
                let closed = path.pop();
                if closed.as_deref() == Some("Blob") {
                    page.blobs.push(std::mem::take(&mut blob));
                }
            }
            Event::Text(text) => {
                let text = text
                    .unescape()
                    .map_err(|e| format!("bad listing XML: {e}"))?;
                take_text(&path, &text, &mut blob, &mut page);
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if !path.is_empty() {
        return Err("bad listing XML: it ends inside an element".to_owned());
    }
    Ok(page)
}

fn take_text(path: &[String], text: &str, blob: &mut ListedBlob, page: &mut Page) {
    let names: Vec<&str> = path.iter().map(String::as_str).collect();
    match names.as_slice() {
        ["EnumerationResults", "NextMarker"] if !text.is_empty() => {
            page.next_marker = Some(text.to_owned());
        }
        [.., "Blob", "Name"] => blob.name.push_str(text),
        [.., "Blob", "Properties", "Etag"] => {
            blob.etag = text.trim_matches('"').to_owned();
        }
        [.., "Blob", "Properties", "Last-Modified"] => blob.last_modified = text.to_owned(),
        [.., "Blob", "Properties", "Content-Length"] => {
            blob.content_length = text.trim().parse().unwrap_or(0);
        }
        [.., "Blob", "Metadata", key] => {
            blob.metadata
                .entry(key.to_ascii_lowercase())
                .or_default()
                .push_str(text);
        }
        _ => {}
    }
}

/// How many blocks a Get Block List answer lists under `UncommittedBlocks`.
pub(crate) fn count_uncommitted_blocks(xml: &str) -> Result<usize, String> {
    let mut reader = Reader::from_str(xml);
    let mut path: Vec<String> = Vec::new();
    let mut count = 0;
    loop {
        match reader
            .read_event()
            .map_err(|e| format!("bad block list XML: {e}"))?
        {
            Event::Start(start) => {
                let name = String::from_utf8_lossy(start.local_name().as_ref()).into_owned();
                if name == "Block" && path.last().is_some_and(|p| p == "UncommittedBlocks") {
                    count += 1;
                }
                path.push(name);
            }
            Event::End(_) => {
                path.pop();
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if !path.is_empty() {
        return Err("bad block list XML: it ends inside an element".to_owned());
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_names_etags_times_metadata_and_the_next_marker() {
        let xml = r#"<?xml version="1.0" encoding="utf-8"?>
<EnumerationResults ServiceEndpoint="http://127.0.0.1/devstoreaccount1" ContainerName="c">
<Prefix>ns/hub/$default/ownership/</Prefix><Blobs>
<Blob><Name>ns/hub/$default/ownership/0</Name><Properties>
<Last-Modified>Wed, 25 Nov 2026 01:00:00 GMT</Last-Modified><Etag>"0x8D1"</Etag>
<Content-Length>0</Content-Length></Properties>
<Metadata><OwnerId>a &amp; b</OwnerId><tributaryversion>3</tributaryversion></Metadata></Blob>
<Blob><Name>ns/hub/$default/ownership/1</Name><Properties><Etag>0x8D2</Etag>
<Content-Length>1234</Content-Length>
<Last-Modified>Wed, 25 Nov 2026 01:00:01 GMT</Last-Modified></Properties><Metadata /></Blob>
</Blobs><NextMarker>2!abc</NextMarker></EnumerationResults>"#;
        let page = parse(xml).unwrap();
        assert_eq!(page.next_marker.as_deref(), Some("2!abc"));
        assert_eq!(page.blobs.len(), 2);
        assert_eq!(page.blobs[0].name, "ns/hub/$default/ownership/0");
        assert_eq!(page.blobs[0].etag, "0x8D1");
        assert_eq!(page.blobs[0].last_modified, "Wed, 25 Nov 2026 01:00:00 GMT");
        assert_eq!(page.blobs[0].metadata["ownerid"], "a & b");
        assert_eq!(page.blobs[0].metadata["tributaryversion"], "3");
        assert_eq!(page.blobs[0].content_length, 0);
        assert_eq!(page.blobs[1].etag, "0x8D2");
        assert!(page.blobs[1].metadata.is_empty());
        assert_eq!(page.blobs[1].content_length, 1234);
    }

    #[test]
    fn an_empty_marker_ends_the_listing_and_bad_xml_is_an_error() {
        let page =
            parse("<EnumerationResults><Blobs /><NextMarker /></EnumerationResults>").unwrap();
        assert!(page.blobs.is_empty());
        assert_eq!(page.next_marker, None);
        assert!(parse("<EnumerationResults><Blobs>").is_err());
        assert!(parse("<a></b>").is_err());
    }

    #[test]
    fn uncommitted_blocks_are_counted() {
        let xml = r#"<?xml version="1.0" encoding="utf-8"?><BlockList><CommittedBlocks>
<Block><Name>YQ==</Name><Size>1</Size></Block></CommittedBlocks><UncommittedBlocks>
<Block><Name>Yg==</Name><Size>2</Size></Block><Block><Name>Yw==</Name><Size>3</Size></Block>
</UncommittedBlocks></BlockList>"#;
        assert_eq!(count_uncommitted_blocks(xml).unwrap(), 2);
        let none = "<BlockList><CommittedBlocks /><UncommittedBlocks /></BlockList>";
        assert_eq!(count_uncommitted_blocks(none).unwrap(), 0);
        assert!(count_uncommitted_blocks("<BlockList><UncommittedBlocks>").is_err());
    }
}
