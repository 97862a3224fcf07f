//! The out-of-band TCP exchange between `ibjitter run` (client) and `ibjitter serve`:
//! length-prefixed JSON messages, versioned, with size limits and a timeout on every wait.
//!
//! Client                         Server
//!   Hello {run, our QPs} ------->   checks the run, makes its QPs, connects them
//!        <----------------------- Accept {its QPs}   (or Reject {reason})
//!   connects its QPs
//!   (--cm: the server makes no QP yet; Accept carries a session token, the client connects
//!    each flow through rdma_cm with the token in the request, see `gen::cm`)
//!   Ready ---------------------->   waits for every expected client (the start barrier)
//!        <----------------------- Go          (sent to all clients at once)
//!   ... traffic ...
//!   Done {what we moved} ------->
//!        <----------------------- Bye {what the server received}
use crate::verbs::{Endpoint, RemoteBuffer};
use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Bumped whenever a message changes shape; both sides must agree.
pub const PROTOCOL_VERSION: u32 = 2;
/// No message is larger (1,000 flows of endpoints take about 200 KiB).
pub const MAX_MESSAGE: usize = 64 << 20;
pub const MAX_FLOWS: u32 = 65_536;
pub const MAX_SIZE: u32 = 1 << 30;
/// Most operations outstanding per flow (`--depth`).
pub const MAX_DEPTH: u32 = 4096;

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Send,
    Write,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Send => "SEND",
            Op::Write => "RDMA_WRITE",
        }
    }
}

/// One flow's side of the connection: its QP and the buffer the peer may write into.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct FlowEndpoint {
    pub qp: Endpoint,
    pub buf: RemoteBuffer,
}

/// What the client asks for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunRequest {
    pub client: String,
    pub op: Op,
    pub size: u32,
    pub depth: u32,
    pub pingpong: bool,
    /// Flows connect through rdma_cm; the QP fields of `flows` are then unused.
    pub cm: bool,
    pub flows: Vec<FlowEndpoint>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    Hello {
        version: u32,
        run: RunRequest,
    },
    Accept {
        flows: Vec<FlowEndpoint>,
        /// With `cm`: what each flow's rdma_cm connection request must carry.
        cm_token: Option<u64>,
    },
    Reject {
        reason: String,
    },
    Ready,
    Go,
    Done {
        ops: u64,
        bytes: u64,
    },
    Bye {
        received_messages: u64,
        received_bytes: u64,
    },
}

impl Message {
    fn kind(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "Hello",
            Message::Accept { .. } => "Accept",
            Message::Reject { .. } => "Reject",
            Message::Ready => "Ready",
            Message::Go => "Go",
            Message::Done { .. } => "Done",
            Message::Bye { .. } => "Bye",
        }
    }
}

/// Checks a request against the protocol's limits; the reason is sent back in a Reject.
pub fn validate(run: &RunRequest) -> Result<(), String> {
    if run.flows.is_empty() || run.flows.len() > MAX_FLOWS as usize {
        return Err(format!(
            "flows must be 1..={MAX_FLOWS}, got {}",
            run.flows.len()
        ));
    }
    if run.size == 0 || run.size > MAX_SIZE {
        return Err(format!(
            "size must be 1..={MAX_SIZE} bytes, got {}",
            run.size
        ));
    }
    if run.depth == 0 || run.depth > MAX_DEPTH {
        return Err(format!("depth must be 1..={MAX_DEPTH}, got {}", run.depth));
    }
    Ok(())
}

pub fn send(stream: &mut TcpStream, msg: &Message) -> io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    if body.len() > MAX_MESSAGE {
        return Err(io::Error::other(format!(
            "{} message too large ({} bytes)",
            msg.kind(),
            body.len()
        )));
    }
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    stream.write_all(&frame)
}

/// Reads one message, waiting at most `timeout` (None: forever). A peer that closes the
/// connection gives `UnexpectedEof`; a timeout gives `TimedOut`, both with what was awaited.
pub fn recv(
    stream: &mut TcpStream,
    timeout: Option<Duration>,
    awaiting: &str,
) -> io::Result<Message> {
    stream.set_read_timeout(timeout)?;
    let mut len = [0u8; 4];
    read_exact(stream, &mut len, awaiting)?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("peer sent a {len}-byte message (limit {MAX_MESSAGE}): not an ibjitter peer?"),
        ));
    }
    let mut body = vec![0u8; len];
    read_exact(stream, &mut body, awaiting)?;
    serde_json::from_slice(&body).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad message while awaiting {awaiting}: {e}"),
        )
    })
}

fn read_exact(stream: &mut TcpStream, buf: &mut [u8], awaiting: &str) -> io::Result<()> {
    stream.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
            io::ErrorKind::TimedOut,
            format!("timed out awaiting {awaiting}"),
        ),
        io::ErrorKind::UnexpectedEof => io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("peer closed the connection (awaiting {awaiting})"),
        ),
        _ => io::Error::new(e.kind(), format!("{e} (awaiting {awaiting})")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn request(flows: usize) -> RunRequest {
        let ep = FlowEndpoint {
            qp: Endpoint {
                qpn: 17,
                psn: 0x123456,
                lid: 0,
                gid: [7; 16],
            },
            buf: RemoteBuffer {
                addr: 0xdead_beef_0000,
                rkey: 42,
                len: 65536,
            },
        };
        RunRequest {
            client: "c".into(),
            op: Op::Write,
            size: 65536,
            depth: 4,
            pingpong: false,
            cm: false,
            flows: vec![ep; flows],
        }
    }

    #[test]
    fn messages_round_trip_over_tcp() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let msgs = vec![
            Message::Hello {
                version: PROTOCOL_VERSION,
                run: request(1000),
            },
            Message::Ready,
            Message::Done { ops: 5, bytes: 10 },
        ];
        let sent = msgs.clone();
        let t = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            for m in &sent {
                send(&mut s, m).unwrap();
            }
        });
        let (mut s, _) = listener.accept().unwrap();
        for m in &msgs {
            assert_eq!(
                &recv(&mut s, Some(Duration::from_secs(5)), "test").unwrap(),
                m
            );
        }
        t.join().unwrap();
        let err = recv(&mut s, Some(Duration::from_secs(5)), "Bye").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(err.to_string().contains("awaiting Bye"), "{err}");
    }

    #[test]
    fn oversized_and_garbage_frames_are_refused() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        });
        let (mut s, _) = listener.accept().unwrap();
        let err = recv(&mut s, Some(Duration::from_secs(5)), "Hello").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        t.join().unwrap();
    }

    #[test]
    fn silence_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = TcpStream::connect(addr).unwrap();
        let (mut s, _) = listener.accept().unwrap();
        let err = recv(&mut s, Some(Duration::from_millis(100)), "Go").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }

    #[test]
    fn limits_are_checked() {
        assert!(validate(&request(1)).is_ok());
        assert!(validate(&request(0)).unwrap_err().contains("flows"));
        let mut r = request(1);
        r.size = 0;
        assert!(validate(&r).unwrap_err().contains("size"));
        r.size = 8;
        r.depth = 0;
        assert!(validate(&r).unwrap_err().contains("depth"));
    }
}
