//! One client's session on the server: its run checked, its flows' QPs and buffer
//! ([`Resources`]), the start barrier, then the data path until the client is done, and what
//! reached the server ([`counts`](super::counts)) back to it.
use super::counts;
use super::resources::Resources;
use super::responder::Finish;
use super::shared::Shared;
use crate::gen::wire::{self, Control, QpType, RunRequest};
use crate::verbs::mtu_bytes;
use std::net::TcpStream;

/// A session token nobody can guess by accident: a connection request must name its session.
fn session_token(id: usize) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_usize(id);
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// Serves one client from Hello to Bye. Errors are reported by the caller.
pub fn session(stream: TcpStream, sh: &Shared, id: usize) -> Result<(), String> {
    let mut control = Control::new(stream);
    let cfg = &sh.cfg;
    let run = control.await_hello(cfg.setup_timeout)?;
    let check = wire::validate(&run).and_then(|()| {
        if run.cm && sh.cm.is_none() {
            Err("this server does not take rdma_cm connections: start it with `ibjitter serve --cm`".into())
        } else {
            fits_this_device(sh, &run)
        }
    });
    if let Err(reason) = check {
        return Err(control.reject(reason));
    }
    let mut res = Resources::new(sh, &run).map_err(|e| {
        control.reject(format!(
            "server could not set up {} flows: {e}",
            run.flows.len()
        ))
    })?;
    // --cm: the client connects each flow through rdma_cm with this session's token; the
    // listener hands us the requests and we make and accept a QP for each.
    let cm = match &sh.cm {
        Some(listener) if run.cm => {
            let token = session_token(id);
            Some((token, listener.register(token)))
        }
        _ => None,
    };
    control.accept(res.endpoints(sh), cm.as_ref().map(|(token, _)| *token))?;
    if let Some((_, (requests, registration))) = cm {
        res.accept_cm(sh, &requests, run.flows.len(), &control)?;
        // Set up: a later request with this token is refused at once, not queued unread.
        drop(registration);
    }
    control.await_ready(cfg.setup_timeout)?;
    sh.barrier.wait(cfg.start_timeout);
    control.go()?;

    let finish = Finish::default();
    let (received, done) = std::thread::scope(|scope| {
        let data = scope.spawn(|| res.data_path(&run, &finish));
        let done = control.await_done();
        // A receive sink counts on until what the client completed has arrived.
        let expect = done.as_ref().map_or(0, |(_, _, by_op)| {
            by_op
                .iter()
                .filter(|c| c.op.counted_at_server())
                .map(|c| c.ops)
                .sum()
        });
        finish.finish(expect);
        (data.join().unwrap_or_default(), done)
    });
    let what = format!(
        "session {id} ({}): {}{} {} flows x {} B{}",
        run.client,
        run.mix.name(),
        if run.qp_type == QpType::Ud {
            " over UD"
        } else {
            ""
        },
        run.flows.len(),
        run.size,
        if run.pingpong { " ping-pong" } else { "" },
    );
    let (client_ops, client_bytes, by_op) = done.map_err(|e| {
        format!(
            "{e}; {what}: received {} messages, {} bytes, {} errors",
            received.sends.messages + received.write_imms.messages,
            received.sends.bytes + received.write_imms.bytes,
            received.errors
        )
    })?;
    let counts = counts::of_session(&run, &received, &by_op, |op| res.atomic_sum(op));
    let (messages, bytes) = counts::totals(&counts);
    println!(
        "{what}: {}",
        counts::summary(&run, &counts, (client_ops, client_bytes), &by_op)
    );
    control.bye(messages, bytes, counts);
    Ok(())
}

/// What this server's device must do for the run: atomics at all; UD datagrams within its
/// path MTU. Each refusal names the limit.
fn fits_this_device(sh: &Shared, run: &RunRequest) -> Result<(), String> {
    let mtu = mtu_bytes(sh.mtu);
    if run.qp_type == QpType::Ud && run.size > mtu {
        return Err(format!(
            "--qp-type ud: --size {} exceeds the server's path MTU, {mtu} bytes ({} port {} \
             active_mtu): a datagram is one packet",
            run.size,
            sh.ctx.name(),
            sh.cfg.ib_port
        ));
    }
    if let Some(op) = run.mix.ops().find(|op| op.is_atomic()) {
        if !sh.limits.atomics {
            return Err(format!(
                "--op {}: the server's device {} does not execute atomics (atomic_cap \
                 IBV_ATOMIC_NONE)",
                op.key(),
                sh.ctx.name()
            ));
        }
    }
    Ok(())
}
