//! A delaying TCP proxy, the slow link between two regions (this kernel has no `netem`).
//!
//! A [`Link`] listens on an address the far region uses and forwards every connection to a
//! target. Each direction of a connection is a reader and a writer joined by a queue of
//! timestamped chunks: the reader stamps a chunk with its arrival and goes on reading, the
//! writer releases it at arrival + the delay. Order is kept (one FIFO queue per direction) and
//! a slow chunk never blocks reading the next one. [`Link::cut`] drops every connection and
//! refuses new ones (they are accepted and closed at once); [`Link::heal`] lets them in again.
#![allow(clippy::disallowed_methods)] // real sockets, real time

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// The bytes one read takes at most.
const CHUNK: usize = 16 * 1024;

/// A running proxy; stops (and drops its connections) when dropped.
pub struct Link {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Where it forwards to.
    pub target: SocketAddr,
    /// `true` while cut; every connection watches it.
    cut: watch::Sender<bool>,
    accept: tokio::task::JoinHandle<()>,
}

impl Link {
    /// A proxy listening on `listen` (port 0: a free one), forwarding to `target`, delaying
    /// each direction by `delay`. Needs a tokio runtime's context (it spawns its tasks on it;
    /// `block_in_place` keeps it).
    pub fn start(listen: SocketAddr, target: SocketAddr, delay: Duration) -> Result<Link> {
        let std = std::net::TcpListener::bind(listen)
            .with_context(|| format!("link: binding {listen}"))?;
        std.set_nonblocking(true)?;
        let listener = TcpListener::from_std(std)?;
        let addr = listener.local_addr()?;
        let (cut, _) = watch::channel(false);
        let state = cut.subscribe();
        let accept = tokio::spawn(accept_loop(listener, target, delay, state));
        Ok(Link { addr, target, cut, accept })
    }

    /// Drops every connection and refuses new ones until [`Link::heal`].
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Lets connections through again.
    pub fn heal(&self) {
        self.cut.send_replace(false);
    }

    /// Whether the link is cut.
    pub fn is_cut(&self) -> bool {
        *self.cut.borrow()
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.cut.send_replace(true);
        self.accept.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    delay: Duration,
    state: watch::Receiver<bool>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        if *state.borrow() {
            drop(client); // refused: closed at once
            continue;
        }
        tokio::spawn(connection(client, target, delay, state.clone()));
    }
}

/// One proxied connection: both directions, until either side closes or the link is cut.
async fn connection(
    client: TcpStream,
    target: SocketAddr,
    delay: Duration,
    mut state: watch::Receiver<bool>,
) {
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let up = tokio::spawn(direction(cr, sw, delay));
    let down = tokio::spawn(direction(sr, cw, delay));
    let (up_abort, down_abort) = (up.abort_handle(), down.abort_handle());
    tokio::select! {
        _ = state.wait_for(|cut| *cut) => {}
        _ = async { let _ = up.await; let _ = down.await; } => {}
    }
    // Cut (or done): aborting drops both halves of both sockets, closing them.
    up_abort.abort();
    down_abort.abort();
}

/// One direction: a reader stamping chunks, a writer releasing each at arrival + `delay`.
async fn direction(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: Duration) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await; // the reader saw end of stream: pass it on
    };
    let reader = async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return, // drops tx: the writer drains, then shuts down
                Ok(n) => {
                    if tx.send((Instant::now() + delay, buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    };
    tokio::join!(reader, writer);
}

/// The links of a two-region cluster share one delay; this is it (30 ms each way).
pub const REGION_DELAY: Duration = Duration::from_millis(30);

/// A link per cross-region path, cut and healed together.
#[derive(Default)]
pub struct Links {
    /// Every link.
    pub all: Vec<Arc<Link>>,
}

impl Links {
    /// Cuts every link.
    pub fn cut(&self) {
        self.all.iter().for_each(|l| l.cut());
    }

    /// Heals every link.
    pub fn heal(&self) {
        self.all.iter().for_each(|l| l.heal());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on loopback: its address.
    async fn echo() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(s: &mut TcpStream, msg: &[u8]) -> Duration {
        let t = Instant::now();
        s.write_all(msg).await.unwrap();
        let mut got = vec![0u8; msg.len()];
        s.read_exact(&mut got).await.unwrap();
        assert_eq!(got, msg, "the link keeps bytes and their order");
        t.elapsed()
    }

    #[tokio::test]
    async fn delays_each_way_and_keeps_order() {
        let link = Link::start("127.0.0.1:0".parse().unwrap(), echo().await, REGION_DELAY).unwrap();
        let mut s = TcpStream::connect(link.addr).await.unwrap();
        for i in 0..5u8 {
            let rtt = round_trip(&mut s, &[i; 100]).await;
            assert!(rtt >= 2 * REGION_DELAY, "round trip {rtt:?} under twice the delay");
        }
        // Many chunks written back to back come out whole and in order, not a delay apart each.
        let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let rtt = round_trip(&mut s, &big).await;
        assert!(rtt >= 2 * REGION_DELAY, "round trip {rtt:?}");
    }

    #[tokio::test]
    async fn cut_closes_connections_and_refuses_new_ones_until_healed() {
        let link = Link::start("127.0.0.1:0".parse().unwrap(), echo().await, REGION_DELAY).unwrap();
        let mut s = TcpStream::connect(link.addr).await.unwrap();
        round_trip(&mut s, b"before").await;
        link.cut();
        assert!(link.is_cut());
        let mut buf = [0u8; 8];
        let n = s.read(&mut buf).await.unwrap_or(0);
        assert_eq!(n, 0, "a cut link closes its connections");
        let mut refused = TcpStream::connect(link.addr).await.unwrap();
        let _ = refused.write_all(b"x").await;
        let n = refused.read(&mut buf).await.unwrap_or(0);
        assert_eq!(n, 0, "a cut link closes new connections at once");
        link.heal();
        let mut s = TcpStream::connect(link.addr).await.unwrap();
        round_trip(&mut s, b"after").await;
    }
}
