//! Runs a [`Connection`] over a tokio byte stream for an application [`Handler`].
//!
//! One task per connection owns the socket and the state machine. It reads whatever the peer
//! sent, lets the engine turn it into [`Event`]s for the handler, takes the handler's
//! commands (from the tasks it spawned: link pumps, broker appends, timers), and writes
//! everything the engine queued in as few writes as possible: a burst of deliveries leaves in
//! one system call. The handler is synchronous — it reacts and queues frames, it never waits —
//! so nothing it does can stall the other links of the connection.
//!
//! # Guarantees
//! - **Keep-alives**: an empty frame whenever nothing was written for half the peer's
//!   idle timeout. **Idle timeout**: a peer silent for this side's idle timeout is closed with
//!   `amqp:resource-limit-exceeded`.
//! - **Backpressure**: while more than [`OUT_BYTES_HIGH`] bytes wait for the socket, neither the
//!   peer's bytes nor the handler's commands are taken; a peer that stops reading stalls only
//!   its own connection.
//! - **Endings**: after this side's `close`, the peer's is awaited for at most
//!   [`CLOSE_WAIT`]; then (or after the peer's `close`, a protocol error or the socket's end)
//!   what is queued is flushed and [`run`] returns how the connection ended.

use std::future::Future;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::connection::{Connection, ConnectionError, Event, amqp_error, condition};

/// Above this many bytes waiting for the socket, reading and commands pause.
pub const OUT_BYTES_HIGH: usize = 4 * 1024 * 1024;

/// How long this side's `close` waits for the peer's.
pub const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Commands handled per wake-up before the socket gets its turn again.
const COMMANDS_PER_TURN: usize = 256;

/// A read buffer above this capacity is given back once empty.
const BUFFER_KEEP_BYTES: usize = 256 * 1024;

/// The application on top of a connection.
pub trait Handler {
    /// What the handler's own tasks send it.
    type Command: Send + 'static;

    /// Something happened on the connection.
    fn on_event(&mut self, connection: &mut Connection, event: Event);

    /// One of the handler's tasks sent a command.
    fn on_command(&mut self, connection: &mut Connection, command: Self::Command);

    /// Everything that arrived in one read and every command taken in one wake-up has been
    /// handled; what the handler gathered across them (replies, acknowledgements) can go out
    /// together now, before the output is written.
    fn on_turn_end(&mut self, _connection: &mut Connection) {}

    /// The shutdown future passed to [`run`] resolved: by default the connection is closed
    /// with `amqp:connection:forced`.
    fn on_shutdown(&mut self, connection: &mut Connection) {
        connection.close(Some(amqp_error(
            "amqp:connection:forced",
            "the server is shutting down",
        )));
    }
}

/// How a connection ended.
#[derive(Debug)]
pub enum Ending {
    /// Both sides closed.
    Closed,
    /// The peer broke the protocol; this side closed with the error.
    Protocol(ConnectionError),
    /// The peer was silent beyond the idle timeout.
    IdleTimeout,
    /// The socket ended or failed without a close.
    Io(std::io::Error),
    /// This side closed and the peer did not answer in time.
    CloseUnanswered,
}

/// Runs `connection` over `stream` until it ends. `buffered`: bytes already read from the
/// stream (what the SASL exchange read past its end). Commands come from `commands`; the
/// handler is asked to shut down when `shutdown` resolves.
pub async fn run<S, H>(
    stream: S,
    buffered: Vec<u8>,
    mut connection: Connection,
    handler: &mut H,
    commands: &mut mpsc::UnboundedReceiver<H::Command>,
    shutdown: impl Future<Output = ()>,
) -> (Connection, Ending)
where
    S: AsyncRead + AsyncWrite + Unpin,
    H: Handler,
{
    let (mut reader, mut writer) = tokio::io::split(stream);
    let mut input = buffered;
    let mut out: Vec<u8> = Vec::new();
    let mut written = 0usize;
    let now = Instant::now();
    let mut last_read = now;
    let mut last_write = now;
    let mut close_deadline: Option<Instant> = None;
    let mut shutdown_asked = false;
    let mut ending: Option<Ending> = None;
    let mut commands_open = true;
    tokio::pin!(shutdown);
    loop {
        if !input.is_empty() && ending.is_none() {
            match connection.receive(&input) {
                Ok(used) => {
                    input.drain(..used);
                }
                Err(error) => {
                    input.clear();
                    ending = Some(Ending::Protocol(error));
                }
            }
            if input.is_empty() && input.capacity() > BUFFER_KEEP_BYTES {
                input = Vec::new();
            }
        }
        while let Some(event) = connection.poll_event() {
            handler.on_event(&mut connection, event);
        }
        handler.on_turn_end(&mut connection);
        connection.move_output_to(&mut out);
        if connection.is_closed() && close_deadline.is_none() {
            close_deadline = Some(Instant::now() + CLOSE_WAIT);
        }
        if connection.is_finished() && ending.is_none() {
            ending = Some(Ending::Closed);
        }
        if ending.is_some() && written == out.len() {
            break;
        }
        let keep_alive_at = connection
            .remote_idle_timeout_ms()
            .map(|ms| last_write + Duration::from_millis(u64::from(ms / 2).max(1)));
        let idle_at = connection
            .local_idle_timeout_ms()
            .map(|ms| last_read + Duration::from_millis(u64::from(ms)));
        let room = out.len() - written < OUT_BYTES_HIGH;
        let reading = room && ending.is_none();
        tokio::select! {
            biased;
            result = writer.write(&out[written..]), if written < out.len() => match result {
                Ok(0) | Err(_) => {
                    let error = result.err().unwrap_or_else(|| std::io::ErrorKind::WriteZero.into());
                    return (connection, Ending::Io(error));
                }
                Ok(n) => {
                    written += n;
                    last_write = Instant::now();
                    if written == out.len() {
                        out.clear();
                        written = 0;
                        if out.capacity() > BUFFER_KEEP_BYTES {
                            out = Vec::new();
                        }
                    }
                }
            },
            result = reader.read_buf(&mut input), if reading => match result {
                Ok(0) => {
                    ending = Some(if connection.is_closed() { Ending::Closed } else {
                        Ending::Io(std::io::ErrorKind::UnexpectedEof.into())
                    });
                    // Nothing more can reach the peer either; stop writing.
                    out.clear();
                    written = 0;
                }
                Ok(_) => last_read = Instant::now(),
                Err(error) => return (connection, Ending::Io(error)),
            },
            command = commands.recv(), if room && commands_open && ending.is_none() => match command {
                Some(command) => {
                    handler.on_command(&mut connection, command);
                    for _ in 1..COMMANDS_PER_TURN {
                        match commands.try_recv() {
                            Ok(command) => handler.on_command(&mut connection, command),
                            Err(_) => break,
                        }
                    }
                }
                None => commands_open = false,
            },
            () = &mut shutdown, if !shutdown_asked => {
                shutdown_asked = true;
                handler.on_shutdown(&mut connection);
            }
            () = sleep_until(keep_alive_at), if keep_alive_at.is_some() && written == out.len() => {
                connection.keep_alive();
                last_write = Instant::now();
            }
            () = sleep_until(idle_at), if idle_at.is_some() && ending.is_none() => {
                connection.close(Some(amqp_error(
                    condition::RESOURCE_LIMIT_EXCEEDED,
                    "the connection was idle beyond its idle timeout",
                )));
                ending = Some(Ending::IdleTimeout);
            }
            () = sleep_until(close_deadline), if close_deadline.is_some() && ending.is_none() => {
                ending = Some(Ending::CloseUnanswered);
            }
        }
    }
    let _ = writer.shutdown().await;
    (connection, ending.unwrap_or(Ending::Closed))
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
