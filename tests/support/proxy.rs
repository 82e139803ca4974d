//! A small forward proxy on loopback: `CONNECT host:port` tunnels (how clients reach https
//! through a proxy) and absolute-form requests (`GET http://host:port/path`, how they reach
//! http). Whatever host a request names, the proxy connects to `upstream`, so a test can use
//! a name only the proxy "resolves" (`api.test`): a request that did not go through the
//! proxy cannot reach the server at all.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub struct TestProxy {
    pub addr: SocketAddr,
    lines: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl TestProxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let seen = lines.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(tunnel(client, upstream, seen.clone()));
            }
        });
        Self { addr, lines, task }
    }

    /// `http://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The first line of each connection's first request: `CONNECT api.test:443 HTTP/1.1`
    /// or `GET http://api.test:80/x HTTP/1.1`.
    pub fn request_lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

impl Drop for TestProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn tunnel(mut client: TcpStream, upstream: SocketAddr, seen: Arc<Mutex<Vec<String>>>) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match client.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let line = String::from_utf8_lossy(&head)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    seen.lock().unwrap().push(line.clone());
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
        return;
    };
    if line.starts_with("CONNECT ") {
        let end = head.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
        if client
            .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
        // Anything the client sent after the CONNECT head is already the tunnel's.
        if server.write_all(&head[end..]).await.is_err() {
            return;
        }
    } else if server.write_all(&head).await.is_err() {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}
