//! A TLS handshake over a blocking socket, finished by one deadline (feature `tls`).
//!
//! rustls's `complete_io` would do it, but it loops inside while bytes keep coming, each read
//! under the socket's own timeout: a peer that trickles its handshake a byte at a time never
//! lets one read time out, and holds the other side for as long as it likes. Both ends of the
//! client protocol step the handshake here instead, each socket operation under what is left
//! of the deadline.

use std::io::{Error, ErrorKind};
use std::net::TcpStream;
use std::time::Instant;

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
    sock: &mut TcpStream,
    deadline: Instant,
) -> std::io::Result<()> {
    let late = || Error::new(ErrorKind::TimedOut, "not finished in time");
    let timed_out = |e: &Error| matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut);
    while conn.is_handshaking() || conn.wants_write() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(late());
        }
        sock.set_read_timeout(Some(left))?;
        sock.set_write_timeout(Some(left))?;
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
