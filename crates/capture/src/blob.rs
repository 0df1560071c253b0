//! [`BlobDestination`] (`blob:`): window files as block blobs in an Azure Storage container (or
//! Azurite), made visible whole the way Azure's own Capture does it.
//!
//! # Where and with what credential
//! A destination is `blob:` followed by the container's URL:
//! `blob:https://{account}.blob.core.windows.net/{container}`, or path-style
//! `blob:http://127.0.0.1:10000/devstoreaccount1/capture` for Azurite. The credential is either
//! a SAS token in that URL (`…/capture?sv=…&sig=…`, needing the read, write, list and create
//! permissions on the container), or a storage connection string (`AccountName=…;AccountKey=…`
//! or `…;SharedAccessSignature=…`) given beside it — [`BlobDestination::open`] takes both; the
//! key's account must be the URL's. The container must exist (Azure's Capture does not create
//! one either): a missing container, an endpoint that does not answer or a refused credential is
//! a [`CaptureError::Destination`] at [`BlobDestination::open`], naming the container and the
//! service's status and error code, never the key or the SAS.
//!
//! # Whole or not at all
//! [`Destination::create`] sends nothing; the pending file stages its bytes as uncommitted
//! blocks (Put Block, [`BLOB_BLOCK_BYTES`] each, so a window holds at most one block in memory).
//! [`PendingFile::publish`] stages the rest and commits the block list in one Put Block List
//! with `If-None-Match: *`: the blob appears whole at that instant, and a blob already under the
//! name is never overwritten (the commit is refused, and the capture's recovery reads that blob
//! back instead). Uncommitted blocks are invisible to Get Blob, Get Blob Properties and List
//! Blobs, so no reader ever sees part of a window.
//!
//! # Leftovers
//! A crash between the first Put Block and the Put Block List leaves uncommitted blocks under the
//! window's name. [`Destination::leftovers`] finds them (List Blobs with `uncommittedblobs`,
//! less the committed blobs) and [`Destination::remove_leftover`] reports them (Get Block List,
//! `blocklisttype=uncommitted`). Blob Storage has no call that deletes uncommitted blocks alone,
//! and none is needed: the capture writes the window again under the same name, and its Put
//! Block List discards every uncommitted block it does not name (the service also discards them a
//! week after the last Put Block). They stay invisible meanwhile.
//!
//! # Sync over async
//! [`Destination`] is synchronous and the blob client async. Each destination owns one thread
//! running a current-thread Tokio runtime; a call hands its request to that thread and blocks
//! the calling thread until the answer (at most 30 s a request). So the rule is: call a
//! `BlobDestination` from a thread that may block — a dedicated thread or
//! `tokio::task::spawn_blocking` — never from an async task on a runtime worker (it would not
//! panic, but it would hold the worker for the whole request). Dropping the destination stops
//! its thread once the files it handed out are dropped too.

use std::future::Future;
use std::io::{Read, Write};
use std::sync::Arc;

use bytes::Bytes;
use tributary_blob::{BlobCredential, BlobError, ContainerClient, block_id};

use crate::destination::{Destination, PendingFile};
use crate::error::CaptureError;
use crate::limits::{BLOB_BLOCK_BYTES, BLOB_LIST_PAGES_MAX, BLOB_READ_BYTES};

/// The prefix that names a Blob Storage destination.
pub const BLOB_SCHEME: &str = "blob:";

/// The thread and runtime a destination's requests run on.
#[derive(Debug)]
struct Bridge {
    handle: tokio::runtime::Handle,
    /// Dropped with the bridge, which ends the runtime's thread.
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Bridge {
    fn start() -> Result<Bridge, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the destination's runtime: {e}"))?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("capture-blob".to_owned())
            .spawn(move || {
                let _ = runtime.block_on(stopped);
            })
            .map_err(|e| format!("cannot start the destination's thread: {e}"))?;
        Ok(Bridge {
            handle,
            _stop: stop,
        })
    }

    /// Runs `request` on the bridge's runtime and waits for its outcome.
    fn run<T: Send + 'static>(
        &self,
        request: impl Future<Output = Result<T, BlobError>> + Send + 'static,
    ) -> Result<T, BlobError> {
        let (done, outcome) = std::sync::mpsc::sync_channel(1);
        self.handle.spawn(async move {
            let _ = done.send(request.await);
        });
        outcome.recv().unwrap_or_else(|_| {
            Err(BlobError::unreachable(
                "calling the blob service",
                "the destination's runtime stopped",
            ))
        })
    }
}

/// A Blob Storage container as a destination. See the module docs for its guarantees.
#[derive(Debug, Clone)]
pub struct BlobDestination {
    client: Arc<ContainerClient>,
    bridge: Arc<Bridge>,
}

impl BlobDestination {
    /// The destination `location` names (`blob:` and a container URL, or the URL alone), with
    /// the credential in the URL's SAS or in `connection_string`; checks that the container
    /// exists and the credential may list it.
    pub fn open(
        location: &str,
        connection_string: Option<&str>,
    ) -> Result<BlobDestination, CaptureError> {
        let url = location.strip_prefix(BLOB_SCHEME).unwrap_or(location);
        let invalid = |e: BlobError| CaptureError::InvalidConfig {
            setting: "capture-destination",
            reason: e.to_string(),
        };
        let credential = connection_string
            .map(|text| BlobCredential::from_connection_string(text).map(|c| c.credential))
            .transpose()
            .map_err(invalid)?;
        let client = ContainerClient::from_url(url, credential).map_err(invalid)?;
        BlobDestination::new(client)
    }

    /// A destination in `client`'s container; checks that it exists and may be listed.
    pub fn new(client: ContainerClient) -> Result<BlobDestination, CaptureError> {
        let bridge = Bridge::start().map_err(|reason| CaptureError::Destination {
            destination: client.container_url(),
            reason,
        })?;
        let destination = BlobDestination {
            client: Arc::new(client),
            bridge: Arc::new(bridge),
        };
        let client = Arc::clone(&destination.client);
        destination
            .bridge
            .run(async move { client.list_page("", None, &[]).await.map(drop) })
            .map_err(|e| destination.error(container_problem(e)))?;
        Ok(destination)
    }

    /// The container's URL (without any SAS token).
    pub fn container_url(&self) -> String {
        self.client.container_url()
    }

    fn error(&self, error: BlobError) -> CaptureError {
        CaptureError::Destination {
            destination: self.client.container_url(),
            reason: error.to_string(),
        }
    }

    /// Runs a request of the client on the destination's runtime.
    fn request<T, F>(&self, request: impl FnOnce(Arc<ContainerClient>) -> F) -> Result<T, BlobError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, BlobError>> + Send + 'static,
    {
        self.bridge.run(request(Arc::clone(&self.client)))
    }

    /// [`request`](Self::request), its error as the capture's.
    fn call<T, F>(&self, request: impl FnOnce(Arc<ContainerClient>) -> F) -> Result<T, CaptureError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, BlobError>> + Send + 'static,
    {
        self.request(request).map_err(|e| self.error(e))
    }

    /// The names of the committed blobs (`uncommitted: false`) or of every blob, those with only
    /// uncommitted blocks included.
    fn names(&self, uncommitted: bool) -> Result<Vec<String>, CaptureError> {
        let include: &'static [&'static str] = if uncommitted {
            &["uncommittedblobs"]
        } else {
            &[]
        };
        self.call(move |client| async move {
            let blobs = client.list("", include, BLOB_LIST_PAGES_MAX).await?;
            Ok(blobs.into_iter().map(|b| b.name).collect())
        })
    }
}

/// A failure to list a container, said as what to do about it.
fn container_problem(error: BlobError) -> BlobError {
    let hint = match error.status() {
        Some(404) => "the container does not exist; create it first (capture does not)",
        Some(403) => "the credential was refused or may not list the container",
        None => "the storage endpoint did not answer",
        Some(_) => "the container cannot be listed",
    };
    BlobError::unreachable("opening the capture container", format!("{hint}: {error}"))
}

impl Destination for BlobDestination {
    fn create(&self, name: &str) -> Result<Box<dyn PendingFile>, CaptureError> {
        Ok(Box::new(BlobFile {
            destination: self.clone(),
            name: name.to_owned(),
            buffer: Vec::new(),
            block_ids: Vec::new(),
            size: 0,
        }))
    }

    fn exists(&self, name: &str) -> Result<bool, CaptureError> {
        let name = name.to_owned();
        self.call(|client| async move { client.properties(&name).await.map(|p| p.is_some()) })
    }

    fn open(&self, name: &str) -> Result<Box<dyn Read + Send>, CaptureError> {
        let size = self.size(name)?;
        Ok(Box::new(BlobReader {
            destination: self.clone(),
            name: name.to_owned(),
            offset: 0,
            size,
            chunk: Bytes::new(),
        }))
    }

    fn size(&self, name: &str) -> Result<u64, CaptureError> {
        let owned = name.to_owned();
        let properties = self.call(|client| async move { client.properties(&owned).await })?;
        properties
            .map(|p| p.content_length)
            .ok_or_else(|| CaptureError::Destination {
                destination: self.client.blob_url(name),
                reason: "no such blob".to_owned(),
            })
    }

    fn remove_leftover(&self, name: &str) -> Result<bool, CaptureError> {
        let name = name.to_owned();
        self.call(|client| async move {
            if client.properties(&name).await?.is_some() {
                return Ok(false);
            }
            Ok(client.uncommitted_blocks(&name).await? > 0)
        })
    }

    fn leftovers(&self) -> Result<Vec<String>, CaptureError> {
        let committed: std::collections::BTreeSet<String> =
            self.names(false)?.into_iter().collect();
        let mut found: Vec<String> = self
            .names(true)?
            .into_iter()
            .filter(|name| !committed.contains(name))
            .collect();
        found.sort();
        found.dedup();
        Ok(found)
    }

    fn url(&self, name: &str) -> String {
        self.client.blob_url(name)
    }

    fn file_type(&self) -> &'static str {
        "AzureBlockBlob"
    }
}

/// A window's blob being staged: its bytes not yet in a block, and the blocks staged so far.
struct BlobFile {
    destination: BlobDestination,
    name: String,
    buffer: Vec<u8>,
    block_ids: Vec<String>,
    size: u64,
}

impl BlobFile {
    /// Stages the buffered bytes as the next block.
    fn stage(&mut self) -> Result<(), CaptureError> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let index = u32::try_from(self.block_ids.len()).map_err(|_| CaptureError::Destination {
            destination: self.destination.url(&self.name),
            reason: "too many blocks for one blob".to_owned(),
        })?;
        let id = block_id(index);
        let data = Bytes::from(std::mem::take(&mut self.buffer));
        let (name, staged) = (self.name.clone(), id.clone());
        self.destination
            .call(|client| async move { client.put_block(&name, &staged, data).await })?;
        self.block_ids.push(id);
        Ok(())
    }
}

impl Write for BlobFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let room = BLOB_BLOCK_BYTES - self.buffer.len();
        let taken = buf.len().min(room);
        self.buffer.extend_from_slice(&buf[..taken]);
        self.size += taken as u64;
        if self.buffer.len() == BLOB_BLOCK_BYTES {
            self.stage().map_err(std::io::Error::other)?;
        }
        Ok(taken)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        // Bytes are staged a whole block at a time; `publish` stages the last one.
        Ok(())
    }
}

impl PendingFile for BlobFile {
    fn publish(mut self: Box<Self>) -> Result<u64, CaptureError> {
        self.stage()?;
        let (name, ids) = (self.name.clone(), std::mem::take(&mut self.block_ids));
        let committed = self
            .destination
            .request(|client| async move { client.put_block_list(&name, &ids, true).await });
        match committed {
            Ok(()) => Ok(self.size),
            Err(e) if matches!(e.status(), Some(409 | 412)) => Err(CaptureError::Destination {
                destination: self.destination.url(&self.name),
                reason: "a blob exists under this name already; it is not overwritten".to_owned(),
            }),
            Err(e) => Err(self.destination.error(e)),
        }
    }
}

/// A committed blob read in ranges of [`BLOB_READ_BYTES`].
struct BlobReader {
    destination: BlobDestination,
    name: String,
    offset: u64,
    size: u64,
    chunk: Bytes,
}

impl Read for BlobReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.chunk.is_empty() && self.offset < self.size {
            let len = BLOB_READ_BYTES.min(self.size - self.offset);
            let (name, offset) = (self.name.clone(), self.offset);
            let chunk = self
                .destination
                .call(|client| async move { client.read_range(&name, offset, len).await })
                .map_err(std::io::Error::other)?;
            if chunk.is_empty() {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.offset += chunk.len() as u64;
            self.chunk = chunk;
        }
        let taken = buf.len().min(self.chunk.len());
        buf[..taken].copy_from_slice(&self.chunk.split_to(taken));
        Ok(taken)
    }
}
