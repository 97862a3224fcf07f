//! The CPUs this process may run on (its affinity mask: what `taskset`, cgroups, Slurm or
//! mpirun's binding left it), and pinning a thread to one. `run --threads auto` starts as many
//! threads as there are CPUs to run them; `--pin` gives each thread its own CPU, so polling
//! threads do not migrate or share a core while another sits idle.

/// The CPUs of this process's affinity mask, in order (never empty: at least CPU 0).
pub fn allowed() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is an empty set; sched_getaffinity fills it for this thread,
    // which has the process's mask (threads inherit it and we pin none before asking).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    if rc != 0 {
        return vec![0];
    }
    let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect();
    if cpus.is_empty() {
        vec![0]
    } else {
        cpus
    }
}

/// Binds the calling thread to `cpu`.
pub fn pin_current_thread(cpu: usize) -> Result<(), String> {
    // SAFETY: a cpu_set_t with one CPU set, applied to the calling thread (pid 0).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    unsafe { libc::CPU_SET(cpu, &mut set) };
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!(
            "cannot pin a thread to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        ))
    }
}

/// The CPU thread `t` of a run is pinned to: the mask's CPUs in turn.
pub fn for_thread(cpus: &[usize], t: usize) -> usize {
    cpus[t % cpus.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_thread_runs_on_its_cpu_only() {
        let cpus = allowed();
        assert!(!cpus.is_empty());
        let last = *cpus.last().unwrap();
        std::thread::spawn(move || {
            pin_current_thread(last).unwrap();
            assert_eq!(allowed(), vec![last]);
            // SAFETY: sched_getcpu has no preconditions.
            assert_eq!(unsafe { libc::sched_getcpu() } as usize, last);
        })
        .join()
        .unwrap();
        // The process's other threads keep the whole mask.
        assert_eq!(allowed(), cpus);
        assert_eq!(for_thread(&[2, 5], 3), 5);
    }
}
