//! Connection limits of both listeners (issue 24): at most `max_connections` open connections
//! per listener and `max_connections_per_peer` from one IP address — the excess is closed as
//! soon as it is accepted, before any byte is read — and a connection idle (no byte either way)
//! for `connection_idle_timeout_ms` is closed. The HTTP listener adds a header-read time-out
//! ([`crate::api::http`]), the gRPC listener a time-out on the HTTP/2 preface
//! ([`ConnLimits::first_bytes`]), HTTP/2 keep-alive pings and a stream limit
//! ([`crate::api::grpc`]). At start-up the node raises its soft descriptor limit to the hard one
//! and fits the listeners' limits into it ([`descriptor_budget`]), so connections can never
//! take the descriptors the store and the other listener need.
//!
//! The time-outs run on the real timer, like TLS handshakes: they guard real sockets.
#![allow(clippy::disallowed_methods)]

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};

use crate::limits::{DESCRIPTORS_RESERVED, DESCRIPTORS_WANTED};
use crate::server::config::NodeConfig;

/// A listener's connection limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Open connections on the listener.
    pub max: usize,
    /// Open connections from one IP address.
    pub per_peer: usize,
    /// A connection with no byte read or written for this long is closed.
    pub idle: Duration,
    /// `(n, within)`: a connection that has not sent its first `n` bytes within `within` of
    /// being accepted is closed (gRPC: the 24-byte HTTP/2 preface within the header time-out,
    /// so connections that never finish opening cannot keep their places; `None`: no such
    /// bound — HTTP/1.1 has its header-read time-out).
    pub first_bytes: Option<(usize, Duration)>,
}

impl ConnLimits {
    /// The limits `config` sets.
    pub fn of(config: &NodeConfig) -> ConnLimits {
        ConnLimits {
            max: config.max_connections,
            per_peer: config.max_connections_per_peer,
            idle: Duration::from_millis(config.connection_idle_timeout_ms),
            first_bytes: None,
        }
    }
}

/// Counts a listener's open connections, in all and per peer.
#[derive(Debug)]
pub struct Gate {
    listener: &'static str,
    limits: ConnLimits,
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// One admitted connection's place; given back when dropped (the connection closed).
#[derive(Debug)]
pub struct Permit {
    gate: Arc<Gate>,
    peer: IpAddr,
}

impl Gate {
    /// A gate for the listener named `listener` (`http`, `grpc`).
    pub fn new(listener: &'static str, limits: ConnLimits) -> Arc<Gate> {
        Arc::new(Gate { listener, limits, open: Mutex::default() })
    }

    /// A place for a connection from `peer`, or why there is none.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Permit, &'static str> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.0 >= self.limits.max {
            return Err("the listener's connection limit (max_connections)");
        }
        let from_peer = open.1.entry(peer).or_default();
        if *from_peer >= self.limits.per_peer {
            return Err("the per-address limit (max_connections_per_peer)");
        }
        *from_peer += 1;
        open.0 += 1;
        Ok(Permit { gate: self.clone(), peer })
    }

    /// Open connections now.
    pub fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).0
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut open = self.gate.open.lock().unwrap_or_else(|e| e.into_inner());
        open.0 = open.0.saturating_sub(1);
        if let Some(n) = open.1.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                open.1.remove(&self.peer);
            }
        }
    }
}

/// A connection admitted by a [`Gate`]: holds its place until dropped, and fails with
/// `TimedOut` once nothing was read or written for the idle time-out, or when its first bytes
/// ([`ConnLimits::first_bytes`]) are late.
#[derive(Debug)]
pub struct Guarded<S> {
    inner: S,
    _permit: Permit,
    idle: Duration,
    last: Instant,
    /// The first bytes still to read, and by when (`None` once they came).
    opening: Option<(usize, Instant)>,
    timer: Pin<Box<Sleep>>,
}

impl<S> Guarded<S> {
    /// The connection itself.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    fn new(inner: S, permit: Permit, limits: &ConnLimits) -> Self {
        let last = Instant::now();
        let opening = limits.first_bytes.map(|(n, within)| (n, last + within));
        let first_due = opening.map_or(last + limits.idle, |(_, by)| by.min(last + limits.idle));
        let timer = Box::pin(tokio::time::sleep_until(first_due));
        Guarded { inner, _permit: permit, idle: limits.idle, last, opening, timer }
    }

    /// Counts `n` bytes read against the first bytes still awaited.
    fn read(&mut self, n: usize) {
        self.last = Instant::now();
        if let Some((left, _)) = &mut self.opening {
            *left = left.saturating_sub(n);
            if *left == 0 {
                self.opening = None;
            }
        }
    }

    /// Pending until the connection has been idle for the time-out (the timer re-arms itself
    /// to the last activity, so activity costs no timer reset).
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            if self.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let now = Instant::now();
            if let Some((left, by)) = self.opening
                && by <= now
            {
                let msg =
                    format!("the connection's first bytes did not arrive in time ({left} missing)");
                return Poll::Ready(io::Error::new(io::ErrorKind::TimedOut, msg));
            }
            let due = self.last + self.idle;
            if due <= now {
                let msg = format!("no byte read or written for {:?}", self.idle);
                return Poll::Ready(io::Error::new(io::ErrorKind::TimedOut, msg));
            }
            let due = self.opening.map_or(due, |(_, by)| by.min(due));
            self.timer.as_mut().reset(due);
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                let n = buf.filled().len() - before;
                if n > 0 {
                    this.read(n);
                }
                Poll::Ready(r)
            }
            Poll::Pending => this.poll_idle(cx).map(Err),
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Ready(r) => {
                if matches!(r, Ok(n) if n > 0) {
                    this.last = Instant::now();
                }
                Poll::Ready(r)
            }
            Poll::Pending => this.poll_idle(cx).map(Err),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_write_vectored(cx, bufs) {
            Poll::Ready(r) => {
                if matches!(r, Ok(n) if n > 0) {
                    this.last = Instant::now();
                }
                Poll::Ready(r)
            }
            Poll::Pending => this.poll_idle(cx).map(Err),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for Guarded<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// Connections accepted on `listener` and admitted by `gate`, each with `TCP_NODELAY`; a
/// connection over a limit is closed at once (the client reads an end of stream right away,
/// rather than waiting on a full backlog). Stops when the receiver is dropped.
pub fn accept(
    listener: TcpListener,
    gate: Arc<Gate>,
) -> mpsc::Receiver<(Guarded<TcpStream>, SocketAddr)> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut refused = Refusals::default();
        loop {
            let (tcp, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of descriptors and the like: wait rather than spin.
                        tracing::warn!(listener = gate.listener, error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = tx.closed() => return,
            };
            match gate.admit(peer.ip()) {
                Ok(permit) => {
                    if let Err(e) = tcp.set_nodelay(true) {
                        tracing::warn!(error = %e, "cannot set TCP_NODELAY");
                    }
                    let io = Guarded::new(tcp, permit, &gate.limits);
                    if tx.send((io, peer)).await.is_err() {
                        return;
                    }
                }
                Err(why) => {
                    refused.note(&gate, peer, why);
                    drop(tcp);
                }
            }
        }
    });
    rx
}

/// Serves HTTP/1.1 on the `conns` a listener admitted until `shutdown` completes, then lets
/// the requests in progress finish. A request's headers (and, on a kept-alive connection, the
/// next request) must arrive within `header_timeout`, or the connection is closed.
pub async fn serve_http<Io>(
    mut conns: mpsc::Receiver<(Io, SocketAddr)>,
    app: axum::Router,
    header_timeout: Duration,
    shutdown: impl Future<Output = ()>,
) where
    Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    use hyper_util::rt::{TokioIo, TokioTimer};
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let io = tokio::select! {
            c = conns.recv() => match c {
                Some((io, _peer)) => io,
                None => break,
            },
            () = &mut shutdown => break,
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let mut http1 = hyper::server::conn::http1::Builder::new();
        http1.timer(TokioTimer::new()).header_read_timeout(header_timeout);
        let conn = graceful.watch(http1.serve_connection(TokioIo::new(io), service));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "HTTP connection ended");
            }
        });
    }
    drop(conns);
    graceful.shutdown().await;
}

/// Logs refused connections at most once a second per listener (a flood must not flood the
/// log too).
#[derive(Default)]
struct Refusals {
    since_log: u64,
    logged: Option<Instant>,
}

impl Refusals {
    fn note(&mut self, gate: &Gate, peer: SocketAddr, why: &str) {
        self.since_log += 1;
        crate::server::metrics::connection_refused(gate.listener);
        if self.logged.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            tracing::warn!(
                listener = gate.listener,
                %peer,
                refused = self.since_log,
                open = gate.open(),
                "connection refused: over {why}"
            );
            self.logged = Some(Instant::now());
            self.since_log = 0;
        }
    }
}

/// What the start-up check of descriptors found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// The soft `RLIMIT_NOFILE` after raising it (`None`: not known on this platform).
    pub descriptors: Option<u64>,
    /// A warning to print, if any.
    pub warning: Option<String>,
}

/// Raises the soft descriptor limit to the hard one, then fits `config`'s connection limits
/// into it: each listener gets at most half of what is left after [`DESCRIPTORS_RESERVED`] (the
/// store, the runtime, outgoing connections), and a peer at most half of a listener's. Warns
/// below [`DESCRIPTORS_WANTED`] and when it lowered a setting.
pub fn descriptor_budget(config: &mut NodeConfig) -> Budget {
    let Some(n) = raise_nofile() else {
        return Budget { descriptors: None, warning: None };
    };
    let share = (n.saturating_sub(DESCRIPTORS_RESERVED) / 2).max(1) as usize;
    let mut warning = Vec::new();
    if n < DESCRIPTORS_WANTED {
        warning.push(format!(
            "only {n} file descriptors (RLIMIT_NOFILE; at least {DESCRIPTORS_WANTED} advised: \
             LimitNOFILE= in a systemd unit, `ulimit -n`)"
        ));
    }
    if config.max_connections > share {
        warning.push(format!(
            "max_connections lowered from {} to {share} per listener to fit",
            config.max_connections
        ));
        config.max_connections = share;
    }
    let per_peer = (config.max_connections / 2).max(1);
    if config.max_connections_per_peer > per_peer {
        config.max_connections_per_peer = per_peer;
    }
    let warning = (!warning.is_empty()).then(|| warning.join("; "));
    Budget { descriptors: Some(n), warning }
}

/// The soft `RLIMIT_NOFILE`, raised to the hard limit first when it is lower.
#[cfg(unix)]
fn raise_nofile() -> Option<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given, which lives on this stack frame.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
        // SAFETY: setrlimit only reads the struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = lim.rlim_max;
        }
    }
    // `rlim_t` is u64 on 64-bit Linux but not on every Unix.
    #[allow(clippy::unnecessary_cast)]
    Some(lim.rlim_cur as u64)
}

#[cfg(not(unix))]
fn raise_nofile() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_counts_per_listener_and_per_peer() {
        let limits =
            ConnLimits { max: 3, per_peer: 2, idle: Duration::from_secs(1), first_bytes: None };
        let gate = Gate::new("test", limits);
        let (a, b): (IpAddr, IpAddr) = ("127.0.0.2".parse().unwrap(), "127.0.0.3".parse().unwrap());
        let a1 = gate.admit(a).unwrap();
        let _a2 = gate.admit(a).unwrap();
        assert!(gate.admit(a).unwrap_err().contains("per-address"));
        let _b1 = gate.admit(b).unwrap();
        assert!(gate.admit(b).unwrap_err().contains("max_connections"));
        drop(a1);
        assert_eq!(gate.open(), 2);
        let _b2 = gate.admit(b).unwrap();
    }

    #[test]
    fn the_budget_fits_the_limits_into_the_descriptors() {
        let mut c = NodeConfig { max_connections: usize::MAX / 4, ..NodeConfig::default() };
        c.max_connections_per_peer = usize::MAX / 4;
        let b = descriptor_budget(&mut c);
        if let Some(n) = b.descriptors {
            assert!(c.max_connections as u64 <= n / 2, "{c:?}");
            assert!(c.max_connections_per_peer <= c.max_connections / 2);
            assert!(b.warning.unwrap().contains("max_connections lowered"));
        }
    }
}
