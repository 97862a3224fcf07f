//! Layer 11: the symbols libibjitter.so exports, each of which only delegates: the
//! interposed libibverbs functions ([`verbs`]), UCX's UCP send calls ([`ucp`]), and
//! `dlsym`/`dlvsym` ([`dl`]) for programs that look verbs up themselves, and the `exec`
//! functions and `_exit` ([`process`]), which end a process without its exit handler.
pub mod dl;
pub mod process;
pub mod ucp;
pub mod verbs;
