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
//!   Done {what we moved, by op} ->
//!        <----------------------- Bye {what the server received, by op; its atomic words}
use super::stop::StopToken;
use crate::verbs::{Endpoint, RemoteBuffer};
use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Bumped whenever a message changes shape; both sides must agree.
pub const PROTOCOL_VERSION: u32 = 3;
/// No message is larger (1,000 flows of endpoints take about 200 KiB).
pub const MAX_MESSAGE: usize = 64 << 20;
pub const MAX_FLOWS: u32 = 65_536;
pub const MAX_SIZE: u32 = 1 << 30;
/// Most operations outstanding per flow (`--depth`).
pub const MAX_DEPTH: u32 = 4096;

pub use super::ops::{Op, OpMix, QpType};

/// One flow's side of the connection: its QP and the buffer the peer may write into (or
/// read from).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct FlowEndpoint {
    pub qp: Endpoint,
    pub buf: RemoteBuffer,
    /// The server's: this flow's two 8-byte atomic words (fetch_add's at this address,
    /// cmp_swap's 8 bytes on), under `buf.rkey`; 0 when the run has no atomics.
    #[serde(default)]
    pub atomic_addr: u64,
}

/// One op type's completed operations and bytes.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct OpCount {
    pub op: Op,
    pub ops: u64,
    pub bytes: u64,
}

/// Whose count the server reports for an op type.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CountedAt {
    /// The server's own receive completions (SEND, WRITE_IMM; a ping-pong's echoes).
    Server,
    /// The client's, told in Done: a WRITE, READ or atomic raises nothing at the server.
    Client,
}

/// What the server reports in Bye beside its totals.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ServerCounts {
    /// Per op type of the run, in the mix's order.
    pub ops: Vec<(OpCount, CountedAt)>,
    /// The sum of the flows' fetch_add words, read after the client was done.
    pub fetch_add_sum: Option<u64>,
    /// The sum of the flows' cmp_swap words (each counts its flow's successful swaps).
    pub cmp_swap_sum: Option<u64>,
    /// Completions in error at the server.
    pub errors: u64,
}

/// What the client asks for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunRequest {
    pub client: String,
    pub mix: OpMix,
    pub qp_type: QpType,
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
        #[serde(default)]
        by_op: Vec<OpCount>,
    },
    Bye {
        received_messages: u64,
        received_bytes: u64,
        #[serde(default)]
        counts: Option<ServerCounts>,
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
    if run.cm && run.qp_type == QpType::Ud {
        return Err("--qp-type ud does not connect: use it without --cm".into());
    }
    run.mix.validate(run.size, run.qp_type, run.pingpong)
}

fn send(stream: &mut TcpStream, msg: &Message) -> io::Result<()> {
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
fn recv(stream: &mut TcpStream, timeout: Option<Duration>, awaiting: &str) -> io::Result<Message> {
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

/// One control connection, spoken step by step in the order of the diagram above: the
/// client's steps, then the server's. Every wait has a timeout except the server's wait for
/// Done (a run lasts as long as it lasts; a dead client closes the connection).
pub struct Control {
    stream: TcpStream,
    /// Set: every wait also ends, within [`STOP_CHECK`], when a stop is asked (Ctrl-C).
    stop: Option<StopToken>,
}

/// How often a wait for the peer checks the stop token.
const STOP_CHECK: Duration = Duration::from_millis(100);

impl Control {
    pub fn new(stream: TcpStream) -> Control {
        let _ = stream.set_nodelay(true);
        Control { stream, stop: None }
    }

    /// Makes every wait for the peer end when `stop` is set (a blocking read restarts after
    /// a signal: Ctrl-C alone would not end it).
    pub fn stop_on(mut self, stop: StopToken) -> Control {
        self.stop = Some(stop);
        self
    }

    /// Waits until the peer has sent something, up to `timeout`, in slices of [`STOP_CHECK`];
    /// Err once the stop token is set. (The deadline itself is left to the read.)
    fn await_readable(&self, timeout: Option<Duration>, awaiting: &str) -> Result<(), String> {
        use std::os::fd::AsRawFd;
        let Some(stop) = self.stop else {
            return Ok(());
        };
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if stop.is_set() {
                return Err(format!("interrupted while awaiting {awaiting}"));
            }
            let mut fd = libc::pollfd {
                fd: self.stream.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the duration of the call.
            let n = unsafe { libc::poll(&mut fd, 1, STOP_CHECK.as_millis() as i32) };
            if n > 0 || deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(());
            }
        }
    }

    /// Client: connects to `server:port`, retrying until `timeout` (in an incast the receiver
    /// may still be starting when the senders are launched) or until `interrupted()`.
    pub fn connect(
        server: &str,
        port: u16,
        timeout: Duration,
        interrupted: &dyn Fn() -> bool,
    ) -> Result<Control, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let addrs: Vec<_> = (server, port)
                .to_socket_addrs()
                .map_err(|e| format!("cannot resolve {server}: {e}"))?
                .collect();
            let mut last = None;
            for a in &addrs {
                match TcpStream::connect_timeout(a, Duration::from_secs(5)) {
                    Ok(s) => return Ok(Control::new(s)),
                    Err(e) => last = Some(e),
                }
            }
            if Instant::now() >= deadline || interrupted() {
                return Err(format!(
                    "cannot connect to ibjitter serve at {server}:{port} (tried for {timeout:?}): {}",
                    last.map_or("no address".into(), |e| e.to_string())
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Client: sends the run (Hello) and returns the server's endpoints, one per flow in
    /// flow order, and the rdma_cm session token if it gave one.
    pub fn hello(
        &mut self,
        run: RunRequest,
        timeout: Duration,
    ) -> Result<(Vec<FlowEndpoint>, Option<u64>), String> {
        let flows = run.flows.len();
        let hello = Message::Hello {
            version: PROTOCOL_VERSION,
            run,
        };
        send(&mut self.stream, &hello).map_err(|e| format!("sending to the server: {e}"))?;
        match self.recv(Some(timeout), "Accept")? {
            Message::Accept {
                flows: theirs,
                cm_token,
            } if theirs.len() == flows => Ok((theirs, cm_token)),
            Message::Accept { flows: theirs, .. } => Err(format!(
                "server accepted {} flows, we asked for {flows}",
                theirs.len()
            )),
            Message::Reject { reason } => Err(format!("server refused the run: {reason}")),
            other => Err(format!("expected Accept from the server, got {other:?}")),
        }
    }

    /// Client: our QPs are connected.
    pub fn ready(&mut self) -> Result<(), String> {
        send(&mut self.stream, &Message::Ready).map_err(|e| format!("sending to the server: {e}"))
    }

    /// Client: waits for the common start.
    pub fn await_go(&mut self, timeout: Duration) -> Result<(), String> {
        match self.recv(Some(timeout), "Go")? {
            Message::Go => Ok(()),
            m => Err(format!("expected Go from the server, got {m:?}")),
        }
    }

    /// Client: tells the server what we moved; returns the bytes it received and its counts
    /// by op, if it answers.
    pub fn done(
        &mut self,
        ops: u64,
        bytes: u64,
        by_op: Vec<OpCount>,
    ) -> Option<(u64, Option<ServerCounts>)> {
        send(&mut self.stream, &Message::Done { ops, bytes, by_op }).ok()?;
        match self.recv(Some(Duration::from_secs(10)), "Bye") {
            Ok(Message::Bye {
                received_bytes,
                counts,
                ..
            }) => Some((received_bytes, counts)),
            _ => None,
        }
    }

    /// Server: waits for a client's run. A client of another protocol version is told why
    /// (Reject) before the error.
    pub fn await_hello(&mut self, timeout: Duration) -> Result<RunRequest, String> {
        match self.recv(Some(timeout), "Hello")? {
            Message::Hello { version, run } if version == PROTOCOL_VERSION => Ok(run),
            Message::Hello { version, .. } => Err(self.reject(format!(
                "protocol version {version}, this server speaks {PROTOCOL_VERSION}: use the same ibjitter on both sides"
            ))),
            other => Err(format!("expected Hello, got {other:?}")),
        }
    }

    /// Server: refuses the run, telling the client why; returns the reason.
    pub fn reject(&mut self, reason: String) -> String {
        let _ = send(
            &mut self.stream,
            &Message::Reject {
                reason: reason.clone(),
            },
        );
        reason
    }

    /// Server: our endpoints, one per flow in the client's order (and the rdma_cm token).
    pub fn accept(
        &mut self,
        flows: Vec<FlowEndpoint>,
        cm_token: Option<u64>,
    ) -> Result<(), String> {
        send(&mut self.stream, &Message::Accept { flows, cm_token }).map_err(|e| e.to_string())
    }

    /// Server: waits until the client's QPs are connected.
    pub fn await_ready(&mut self, timeout: Duration) -> Result<(), String> {
        match self.recv(Some(timeout), "Ready")? {
            Message::Ready => Ok(()),
            other => Err(format!("expected Ready, got {other:?}")),
        }
    }

    /// Server: starts the client.
    pub fn go(&mut self) -> Result<(), String> {
        send(&mut self.stream, &Message::Go).map_err(|e| e.to_string())
    }

    /// Server: waits, without a limit, for the client's Done; returns the operations and
    /// bytes it completed, in all and by op.
    pub fn await_done(&mut self) -> Result<(u64, u64, Vec<OpCount>), String> {
        match self.recv(None, "Done") {
            Ok(Message::Done { ops, bytes, by_op }) => Ok((ops, bytes, by_op)),
            Ok(other) => Err(format!("expected Done, got {other:?}")),
            Err(e) => Err(format!("client lost: {e}")),
        }
    }

    /// Server: what this session received.
    pub fn bye(&mut self, received_messages: u64, received_bytes: u64, counts: ServerCounts) {
        let _ = send(
            &mut self.stream,
            &Message::Bye {
                received_messages,
                received_bytes,
                counts: Some(counts),
            },
        );
    }

    /// Whether the peer has closed the connection (it gave up or died); never blocks. Only
    /// between steps: a message that arrived is left unread.
    pub fn peer_gone(&self) -> bool {
        if self.stream.set_nonblocking(true).is_err() {
            return false;
        }
        let gone = match self.stream.peek(&mut [0u8; 1]) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
        };
        let _ = self.stream.set_nonblocking(false);
        gone
    }

    fn recv(&mut self, timeout: Option<Duration>, awaiting: &str) -> Result<Message, String> {
        let started = Instant::now();
        self.await_readable(timeout, awaiting)?;
        let left = timeout.map(|t| t.saturating_sub(started.elapsed()).max(STOP_CHECK));
        recv(&mut self.stream, left, awaiting).map_err(|e| e.to_string())
    }
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
                rd_atomic: 16,
            },
            buf: RemoteBuffer {
                addr: 0xdead_beef_0000,
                rkey: 42,
                len: 65536,
            },
            atomic_addr: 0xdead_beef_8000,
        };
        RunRequest {
            client: "c".into(),
            mix: OpMix::parse("write:3,fetch_add:1").unwrap(),
            qp_type: QpType::Rc,
            size: 8,
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
            Message::Done {
                ops: 5,
                bytes: 10,
                by_op: vec![OpCount {
                    op: Op::CmpSwap,
                    ops: 5,
                    bytes: 10,
                }],
            },
            Message::Bye {
                received_messages: 1,
                received_bytes: 2,
                counts: Some(ServerCounts {
                    ops: vec![(
                        OpCount {
                            op: Op::WriteImm,
                            ops: 1,
                            bytes: 2,
                        },
                        CountedAt::Server,
                    )],
                    fetch_add_sum: Some(3),
                    cmp_swap_sum: None,
                    errors: 0,
                }),
            },
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
        // The op rules hold at the server too, whatever a client sends.
        r.depth = 4;
        r.size = 64;
        assert!(validate(&r).unwrap_err().contains("8-byte atomic"));
        r.size = 8;
        r.qp_type = QpType::Ud;
        assert!(validate(&r).unwrap_err().contains("SEND only"));
        r.mix = OpMix::single(Op::Send);
        r.cm = true;
        assert!(validate(&r).unwrap_err().contains("without --cm"));
    }
}
