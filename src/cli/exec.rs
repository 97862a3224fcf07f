//! `ibjitter exec [injector options] -- PROGRAM [ARGS…]`: runs PROGRAM under libibjitter.so in
//! this very process (execve: same pid, its exit status and signals), after the shim itself
//! has accepted the settings. The flags come from [`ibjitter::inject_env::SETTINGS`], so each
//! variable the shim reads has exactly one flag, documented once.
use super::exit;
use clap::{Arg, ArgAction, ArgMatches, Args, FromArgMatches};
use ibjitter::inject_env::{self, InjectorEnv, SETTINGS};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

/// The program could not be started: not found (the shells' and env(1)'s 127) or not
/// executable (126).
const NOT_FOUND: i32 = 127;
const NOT_EXECUTABLE: i32 = 126;

pub struct ExecArgs {
    /// (variable, value) for each injector flag given.
    settings: Vec<(&'static str, String)>,
    shim: Option<PathBuf>,
    command: Vec<OsString>,
}

const HEADING: &str =
    "Injector settings (each sets the IBJITTER_ variable in brackets; same grammar)";

impl Args for ExecArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        let cmd = cmd
            .after_help(
                "The settings are checked by the injector itself before PROGRAM starts: a \
                 refused one is reported with the injector's message and exit status 2, and \
                 nothing is run. Then PROGRAM replaces this process (same pid; its exit status \
                 and signals are PROGRAM's). Under a launcher: mpirun -np 4 ibjitter exec \
                 --delay 50us -- ./app, or srun ibjitter exec --delay 50us -- ./app.",
            )
            .arg(
                Arg::new("shim")
                    .long("shim")
                    .value_name("PATH")
                    .value_parser(clap::value_parser!(PathBuf))
                    .help(
                        "libibjitter.so (default: PREFIX/lib/ibjitter/ of an installed \
                         ibjitter, else beside this binary)",
                    ),
            )
            .arg(
                Arg::new("command")
                    .value_name("PROGRAM")
                    .help("The program and its arguments, after --")
                    .num_args(1..)
                    .last(true)
                    .required(true)
                    .value_parser(clap::value_parser!(OsString)),
            );
        SETTINGS.iter().fold(cmd, |cmd, s| {
            let arg = Arg::new(s.flag)
                .long(s.flag)
                .value_name(s.value)
                .help(format!("{} [{}]", s.help, s.var))
                .help_heading(HEADING)
                .action(ArgAction::Set);
            cmd.arg(if s.switch {
                arg.num_args(0..=1)
                    .require_equals(true)
                    .default_missing_value("1")
            } else {
                arg.num_args(1)
            })
        })
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for ExecArgs {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let settings = SETTINGS
            .iter()
            .filter_map(|s| m.get_one::<String>(s.flag).map(|v| (s.var, v.clone())))
            .collect();
        Ok(ExecArgs {
            settings,
            shim: m.get_one::<PathBuf>("shim").cloned(),
            command: m
                .get_many::<OsString>("command")
                .map(|v| v.cloned().collect())
                .unwrap_or_default(),
        })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

pub fn run(a: ExecArgs) -> i32 {
    let env = match prepare(&a) {
        Ok(env) => env,
        Err(e) => {
            eprintln!("ibjitter exec: {e}");
            return exit::SETUP;
        }
    };
    let program = &a.command[0];
    if let Some(why) = inject_env::preload_ignored_by(program) {
        // Run anyway: what it starts may be dynamically linked (a static shell running the
        // real program) and load the injector from the environment it passes on.
        eprintln!("ibjitter exec: warning: {why}");
    }
    let mut cmd = std::process::Command::new(program);
    cmd.args(&a.command[1..]);
    env.apply(&mut cmd);
    // Only returns if the program could not be started.
    let e = cmd.exec();
    eprintln!(
        "ibjitter exec: cannot run {}: {e}",
        program.to_string_lossy()
    );
    if e.kind() == std::io::ErrorKind::NotFound {
        NOT_FOUND
    } else {
        NOT_EXECUTABLE
    }
}

/// The shim, the environment, and the shim's own verdict on it.
fn prepare(a: &ExecArgs) -> Result<InjectorEnv, String> {
    let shim = match &a.shim {
        Some(p) if p.is_file() => std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()),
        Some(p) => return Err(format!("--shim {}: no such file", p.display())),
        None => {
            let exe = std::env::current_exe()
                .map_err(|e| format!("cannot find this program's path: {e} (give --shim)"))?;
            inject_env::find_shim(&exe)?
        }
    };
    let mut env = InjectorEnv::new(shim);
    for (var, value) in &a.settings {
        env.set(*var, value);
    }
    env.check(&inject_env::probe_program()?)
        .map_err(|e| format!("the injector refused these settings, nothing was run:\n{e}"))?;
    Ok(env)
}
