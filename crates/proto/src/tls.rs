//! TLS over a blocking socket with deadlines that hold (feature `tls`): a handshake finished
//! by one deadline, and reads that take the socket once.
//!
//! rustls's `complete_io`, and `StreamOwned::read` through it, loop inside while bytes keep
//! coming, each read under the socket's own timeout: a peer that trickles a handshake, or one
//! record of data, a byte at a time never lets one read time out, and holds the other side for
//! as long as it likes (a 16 KiB record at a byte every 50 ms is 14 minutes, and then the next
//! one). Both ends of the client protocol step the handshake here, each socket operation under
//! what is left of the deadline, and read with [`read_some`], which reads the socket at most
//! once; the server also follows the record framing ([`FramedSocket`]) to time a frame from
//! its first byte on the wire.

use std::io::{Error, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

/// A socket the TLS helpers step: a byte stream with its TCP socket underneath, for the
/// timeouts.
pub trait Socket: Read + Write {
    /// The TCP socket.
    fn tcp(&self) -> &TcpStream;
}

impl Socket for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

/// A TCP socket that follows the TLS record framing of what is read from it, from its first
/// byte: whether a record has begun to arrive and not ended ([`FramedSocket::mid_record`]).
/// Every byte a TLS peer sends is part of a record (a 5-byte header: type, version, length;
/// then that many bytes), so a reader that sees them all from the start stays in step.
#[derive(Debug)]
pub struct FramedSocket {
    /// The socket.
    pub sock: TcpStream,
    head: [u8; 5],
    have: usize,
    left: usize,
}

impl FramedSocket {
    /// `sock`, before anything was read from it.
    pub fn new(sock: TcpStream) -> FramedSocket {
        FramedSocket {
            sock,
            head: [0; 5],
            have: 0,
            left: 0,
        }
    }

    /// Whether part of a record has arrived and the rest not yet.
    pub fn mid_record(&self) -> bool {
        self.have > 0 || self.left > 0
    }

    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.left > 0 {
                let k = self.left.min(bytes.len());
                self.left -= k;
                bytes = &bytes[k..];
                continue;
            }
            let k = (5 - self.have).min(bytes.len());
            self.head[self.have..self.have + k].copy_from_slice(&bytes[..k]);
            self.have += k;
            bytes = &bytes[k..];
            if self.have == 5 {
                self.have = 0;
                self.left = usize::from(u16::from_be_bytes([self.head[3], self.head[4]]));
            }
        }
    }
}

impl Read for FramedSocket {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.sock.read(buf)?;
        self.feed(&buf[..n]);
        Ok(n)
    }
}

impl Write for FramedSocket {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.sock.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.sock.flush()
    }
}

impl Socket for FramedSocket {
    fn tcp(&self) -> &TcpStream {
        &self.sock
    }
}

/// Reads decrypted bytes into `buf`, taking the socket at most once (under its read timeout):
/// `Ok(n)` with `n > 0` bytes, `Ok(0)` when the peer closed, `Interrupted` when bytes came
/// but completed no record of data (read again at once, more may be waiting; a caller with
/// deadlines looks at them first), and the socket's own `WouldBlock` or `TimedOut` when
/// nothing came.
pub fn read_some<Data>(
    conn: &mut rustls::ConnectionCommon<Data>,
    sock: &mut impl Socket,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    match conn.reader().read(buf) {
        Ok(n) => return Ok(n),
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        Err(e) => return Err(e),
    }
    if conn.read_tls(sock)? == 0 {
        return Ok(0);
    }
    let state = match conn.process_new_packets() {
        Ok(s) => s,
        Err(e) => {
            let _ = conn.write_tls(sock);
            return Err(Error::new(ErrorKind::InvalidData, e));
        }
    };
    if conn.wants_write() {
        // An alert or a post-handshake answer; the next write flushes what this one leaves.
        let _ = conn.write_tls(sock);
    }
    if state.plaintext_bytes_to_read() == 0 {
        return if state.peer_has_closed() {
            Ok(0)
        } else {
            Err(ErrorKind::Interrupted.into())
        };
    }
    conn.reader().read(buf)
}

/// Steps `conn`'s handshake over `sock` until it is done and its last flight is sent (under
/// TLS 1.2 the client waits for the server's Finished before it says anything), or until
/// `deadline`. Leaves `sock`'s timeouts set to what was left at its last operation.
///
/// Errors: `TimedOut` past the deadline; `UnexpectedEof` when the peer closed; `InvalidData`
/// wrapping the [`rustls::Error`] when the handshake failed (an untrusted certificate, an
/// alert, bytes that are not TLS), after sending the alert rustls queued, as `complete_io`
/// does; any other error of the socket as it came.
pub fn handshake<Data>(
    conn: &mut rustls::ConnectionCommon<Data>,
    sock: &mut impl Socket,
    deadline: Instant,
) -> std::io::Result<()> {
    let late = || Error::new(ErrorKind::TimedOut, "not finished in time");
    let timed_out = |e: &Error| matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut);
    while conn.is_handshaking() || conn.wants_write() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(late());
        }
        sock.tcp().set_read_timeout(Some(left))?;
        sock.tcp().set_write_timeout(Some(left))?;
        if conn.wants_write() {
            match conn.write_tls(sock) {
                Ok(_) => continue,
                // A signal: a socket with a timeout is not restarted (SA_RESTART or not).
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if timed_out(&e) => return Err(late()),
                Err(e) => return Err(e),
            }
        }
        if !conn.wants_read() {
            // Neither side's turn: not a state a handshake in progress gets into.
            return Err(Error::other("stalled: neither side's turn"));
        }
        match conn.read_tls(sock) {
            Ok(0) => {
                return Err(Error::new(
                    ErrorKind::UnexpectedEof,
                    "the peer closed the connection",
                ));
            }
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if timed_out(&e) => return Err(late()),
            Err(e) => return Err(e),
        }
        if let Err(e) = conn.process_new_packets() {
            let _ = conn.write_tls(sock);
            return Err(Error::new(ErrorKind::InvalidData, e));
        }
    }
    Ok(())
}
