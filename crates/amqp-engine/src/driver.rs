//! Runs a [`Connection`] over a tokio byte stream for an application [`Handler`].
//!
//! One task per connection owns the socket and the state machine. It reads whatever the peer
//! sent, lets the engine turn it into [`Event`]s for the handler, takes the handler's
//! commands (from the tasks it spawned: link pumps, broker appends, timers), and writes
//! everything the engine queued in as few writes as possible: a burst of deliveries leaves in
//! one system call, a vectored write of the frames and of the long bodies sent from where
//! they are (streams without vectored writes get the bodies copied into the frames). The handler is synchronous — it reacts and queues frames, it never waits —
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
//! - **Quiet connections hold little**: after [`QUIET_AFTER`] without a read or a write, the
//!   input and output buffers and the engine's spare capacity are given back and the next read
//!   is offered only [`READ_ROOM_QUIET`] bytes (doubling from there while reads fill it). A
//!   connection never quiet that long keeps its buffers, so busy connections pay nothing: its
//!   output buffers (the driver's and the engine's, swapped each turn) keep the capacity of the
//!   largest turn's output until then.

use std::future::Future;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::connection::{Connection, ConnectionError, Event, amqp_error, condition};
use crate::output::Output;

/// Above this many bytes waiting for the socket, reading and commands pause.
pub const OUT_BYTES_HIGH: usize = 4 * 1024 * 1024;

/// How long this side's `close` waits for the peer's.
pub const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// The most slices one vectored write is given (Linux takes up to 1,024): a frame's bytes
/// and a body sent from where it is are one each.
const WRITE_SLICES_MAX: usize = 512;

/// Commands handled per wake-up before the socket gets its turn again.
const COMMANDS_PER_TURN: usize = 256;

/// A read buffer above this capacity is given back once empty (a large frame's). The output
/// buffer keeps its capacity while the connection is busy.
const BUFFER_KEEP_BYTES: usize = 256 * 1024;

/// The least and the most room a read offers the socket. A read takes at most the room the
/// buffer has; without a floor, a buffer drained to a few bytes each turn would read a few
/// hundred bytes per system call for the rest of the connection.
const READ_ROOM_MIN: usize = 8 * 1024;
const READ_ROOM_MAX: usize = 128 * 1024;
const _: () = assert!(READ_ROOM_MIN <= READ_ROOM_MAX && READ_ROOM_MAX <= BUFFER_KEEP_BYTES);

/// Without a read or a write for this long, a connection gives its buffers back.
pub const QUIET_AFTER: Duration = Duration::from_millis(200);

/// The room a quiet connection's read is offered: enough for a keep-alive, a flow or a
/// small request; a read that fills it doubles the room, as any full read does.
pub const READ_ROOM_QUIET: usize = 512;
const _: () = assert!(READ_ROOM_QUIET <= READ_ROOM_MIN);

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
    let mut io = Io::new(buffered);
    io.splice = writer.is_write_vectored();
    let mut shutdown_asked = false;
    let mut commands_open = true;
    tokio::pin!(shutdown);
    while !io.turn(&mut connection, handler) {
        let [keep_alive_at, idle_at, wake_at] = io.deadlines(&connection);
        let room = io.out.pending() < OUT_BYTES_HIGH;
        let reading = room && io.ending.is_none();
        let offered = if reading { io.make_read_room() } else { 0 };
        let flushed = io.out.is_flushed();
        let slices = if flushed {
            Vec::new()
        } else {
            io.out.slices(WRITE_SLICES_MAX)
        };
        tokio::select! {
            biased;
            result = writer.write_vectored(&slices), if !flushed => match result {
                Ok(0) | Err(_) => {
                    let error = result.err().unwrap_or_else(|| std::io::ErrorKind::WriteZero.into());
                    return (connection, Ending::Io(error));
                }
                Ok(n) => io.wrote(n),
            },
            result = reader.read_buf(&mut io.input), if reading => match result {
                Ok(0) => io.read_ended(&connection),
                Ok(n) => io.read(n, offered),
                Err(error) => return (connection, Ending::Io(error)),
            },
            command = commands.recv(), if room && commands_open && io.ending.is_none() => match command {
                Some(command) => take_commands(&mut connection, handler, command, commands),
                None => commands_open = false,
            },
            () = &mut shutdown, if !shutdown_asked => {
                shutdown_asked = true;
                handler.on_shutdown(&mut connection);
            }
            () = sleep_until(keep_alive_at), if keep_alive_at.is_some() && flushed => {
                connection.keep_alive();
                io.last_write = Instant::now();
            }
            () = sleep_until(wake_at), if wake_at.is_some() && io.ending.is_none() => {
                if idle_at.is_some_and(|at| at <= Instant::now()) {
                    connection.close(Some(amqp_error(
                        condition::RESOURCE_LIMIT_EXCEEDED,
                        "the connection was idle beyond its idle timeout",
                    )));
                    io.ending = Some(Ending::IdleTimeout);
                } else {
                    io.release(&mut connection);
                }
            }
            () = sleep_until(io.close_deadline), if io.close_deadline.is_some() && io.ending.is_none() => {
                io.ending = Some(Ending::CloseUnanswered);
            }
        }
    }
    let _ = writer.shutdown().await;
    (connection, io.ending.unwrap_or(Ending::Closed))
}

/// What [`run`] keeps between wake-ups: the bytes read and to write, the clocks, the ending.
struct Io {
    /// Bytes read and not handled yet: the start of a frame between turns. What a turn reads is
    /// split off and shared with the deliveries read from it ([`Connection::receive_buf`]).
    input: BytesMut,
    /// The room the next read gets: doubled after a read that filled it, halved after one that
    /// used under a quarter, within [`READ_ROOM_MIN`]..=[`READ_ROOM_MAX`]. A busy connection
    /// reads in large chunks; a quiet one asks for little, and one given back its buffers
    /// ([`Io::release`]) for [`READ_ROOM_QUIET`].
    read_room: usize,
    /// Whether the buffers were given back since the last read or write.
    released: bool,
    /// What waits for the socket.
    out: Output,
    /// Whether bodies go to the socket as they are, with vectored writes (else they are copied
    /// into the frames: a stream without vectored writes would take one slice per call).
    splice: bool,
    last_read: Instant,
    last_write: Instant,
    close_deadline: Option<Instant>,
    ending: Option<Ending>,
}

impl Io {
    fn new(buffered: Vec<u8>) -> Self {
        let now = Instant::now();
        Io {
            input: BytesMut::from(&buffered[..]),
            read_room: READ_ROOM_MIN,
            released: false,
            out: Output::default(),
            splice: false,
            last_read: now,
            last_write: now,
            close_deadline: None,
            ending: None,
        }
    }

    /// The connection reads what arrived, the handler acts on the events, the output is
    /// gathered; returns whether the run is over (it ended and everything is written).
    fn turn<H: Handler>(&mut self, connection: &mut Connection, handler: &mut H) -> bool {
        if !self.input.is_empty() && self.ending.is_none() {
            if let Err(error) = connection.receive_buf(&mut self.input) {
                self.input.clear();
                self.ending = Some(Ending::Protocol(error));
            }
            if self.input.is_empty() && self.input.capacity() > BUFFER_KEEP_BYTES {
                self.input = BytesMut::new();
            }
        }
        while let Some(event) = connection.poll_event() {
            handler.on_event(connection, event);
        }
        handler.on_turn_end(connection);
        connection.move_output_into(&mut self.out, self.splice);
        if connection.is_closed() && self.close_deadline.is_none() {
            self.close_deadline = Some(Instant::now() + CLOSE_WAIT);
        }
        if connection.is_finished() && self.ending.is_none() {
            self.ending = Some(Ending::Closed);
        }
        self.ending.is_some() && self.out.is_flushed()
    }

    /// When the connection needs attention if nothing arrives: the next keep-alive, the idle
    /// timeout, and the earlier of the idle timeout and, until the buffers are given back, the
    /// moment the connection counts as quiet (one timer for both).
    fn deadlines(&self, connection: &Connection) -> [Option<Instant>; 3] {
        let keep_alive_at = connection
            .remote_idle_timeout_ms()
            .map(|ms| self.last_write + Duration::from_millis(u64::from(ms / 2).max(1)));
        let idle_at = connection
            .local_idle_timeout_ms()
            .map(|ms| self.last_read + Duration::from_millis(u64::from(ms)));
        let quiet_at = (!self.released).then(|| self.last_read.max(self.last_write) + QUIET_AFTER);
        let wake_at = match (idle_at, quiet_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        [keep_alive_at, idle_at, wake_at]
    }

    /// Makes room in the input buffer for the next read; returns the room offered.
    fn make_read_room(&mut self) -> usize {
        self.input.reserve(self.read_room);
        self.input.capacity() - self.input.len()
    }

    /// A read of `n` bytes arrived (`n > 0`) into `offered` bytes of room.
    fn read(&mut self, n: usize, offered: usize) {
        debug_assert!(n > 0 && n <= offered);
        self.last_read = Instant::now();
        self.released = false;
        if n >= offered {
            self.read_room = (self.read_room * 2).min(READ_ROOM_MAX);
        } else if n < self.read_room / 4 && self.read_room > READ_ROOM_MIN {
            self.read_room = (self.read_room / 2).max(READ_ROOM_MIN);
        }
        assert!((READ_ROOM_QUIET..=READ_ROOM_MAX).contains(&self.read_room));
    }

    /// The connection was quiet for [`QUIET_AFTER`]: gives back the buffers that hold nothing
    /// and the engine's spare capacity; the next read is offered [`READ_ROOM_QUIET`].
    fn release(&mut self, connection: &mut Connection) {
        self.released = true;
        if self.input.is_empty() {
            self.input = BytesMut::new();
            self.read_room = READ_ROOM_QUIET;
        }
        self.out.release();
        connection.release_spare_memory();
    }

    /// `n` more bytes of the output reached the socket.
    fn wrote(&mut self, n: usize) {
        self.last_write = Instant::now();
        self.released = false;
        // Once all is written the buffer is cleared, not dropped: the next turn's output (a
        // burst of deliveries is often larger than a read buffer) reuses the capacity instead
        // of growing a new buffer by doublings. A connection quiet for [`QUIET_AFTER`] gives
        // it back.
        self.out.advance(n);
    }

    /// The peer's side of the socket ended.
    fn read_ended(&mut self, connection: &Connection) {
        self.ending = Some(if connection.is_closed() {
            Ending::Closed
        } else {
            Ending::Io(std::io::ErrorKind::UnexpectedEof.into())
        });
        // Nothing more can reach the peer either; stop writing.
        self.out.clear();
    }
}

/// Hands the handler `first` and up to [`COMMANDS_PER_TURN`] in all of those already waiting.
fn take_commands<H: Handler>(
    connection: &mut Connection,
    handler: &mut H,
    first: H::Command,
    commands: &mut mpsc::UnboundedReceiver<H::Command>,
) {
    handler.on_command(connection, first);
    for _ in 1..COMMANDS_PER_TURN {
        match commands.try_recv() {
            Ok(command) => handler.on_command(connection, command),
            Err(_) => break,
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_get_more_room_while_they_fill_it_and_less_when_they_use_little() {
        let mut io = Io::new(Vec::new());
        // A busy socket: every read fills the room it was offered.
        let mut offers = Vec::new();
        for _ in 0..8 {
            let offered = io.make_read_room();
            offers.push(offered);
            io.read(offered, offered);
        }
        assert!(offers[0] >= READ_ROOM_MIN);
        assert!(offers.windows(2).all(|pair| pair[1] >= pair[0]));
        assert!(*offers.last().unwrap() >= READ_ROOM_MAX);
        assert_eq!(io.read_room, READ_ROOM_MAX);
        // A quiet one: small reads shrink the room back to the floor, never below it.
        for _ in 0..8 {
            let offered = io.make_read_room();
            io.read(100, offered);
        }
        assert_eq!(io.read_room, READ_ROOM_MIN);
        // A read between a quarter and all of the room leaves it as it is.
        io.read_room = 4 * READ_ROOM_MIN;
        io.read(2 * READ_ROOM_MIN, 4 * READ_ROOM_MIN);
        assert_eq!(io.read_room, 4 * READ_ROOM_MIN);
    }

    #[test]
    fn a_quiet_connection_gives_its_buffers_back_and_regrows_on_full_reads() {
        let mut io = Io::new(Vec::new());
        let mut connection = Connection::server(crate::connection::Config::new("quiet"));
        let offered = io.make_read_room();
        io.read(offered, offered);
        io.out.append(&mut vec![0; 3000], &mut Vec::new());
        io.wrote(3000);
        assert!(io.input.capacity() >= READ_ROOM_MIN && io.out.capacity() >= 3000);
        io.release(&mut connection);
        assert_eq!((io.input.capacity(), io.out.capacity()), (0, 0));
        assert_eq!(io.make_read_room(), READ_ROOM_QUIET);
        // Small reads (keep-alives) keep the quiet room; full ones double it again.
        io.read(8, READ_ROOM_QUIET);
        assert_eq!(io.read_room, READ_ROOM_QUIET);
        assert!(!io.released);
        for _ in 0..4 {
            let offered = io.make_read_room();
            io.read(offered, offered);
        }
        assert!(io.read_room >= READ_ROOM_MIN);
    }

    #[test]
    fn bytes_not_yet_handled_or_written_are_kept_when_quiet() {
        let mut io = Io::new(vec![1, 2, 3]);
        let mut connection = Connection::server(crate::connection::Config::new("quiet"));
        io.out.append(&mut vec![7; 100], &mut Vec::new());
        io.wrote(40);
        io.release(&mut connection);
        assert_eq!(io.input[..], [1, 2, 3]);
        assert_eq!(io.out.pending(), 60);
    }

    #[test]
    fn a_buffer_drained_each_turn_still_offers_the_floor() {
        let mut io = Io::new(Vec::new());
        for leftover in [0usize, 37, 500, 4000] {
            io.input.clear();
            io.input.resize(leftover, 0);
            assert!(io.make_read_room() >= READ_ROOM_MIN);
        }
    }
}
