//! Layer 11: the symbols libibjitter.so exports, each of which only delegates: the
//! interposed libibverbs functions ([`verbs`]), UCX's UCP send calls ([`ucp`]), and
//! `dlsym`/`dlvsym` ([`dl`]) for programs that look verbs up themselves.
pub mod dl;
pub mod ucp;
pub mod verbs;
