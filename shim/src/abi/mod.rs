//! Layer 1: what the shim knows of other objects' memory: libibverbs' struct layouts and
//! function types ([`verbs`]), and the ELF dynamic tables of loaded objects ([`elf`]).
pub mod elf;
pub mod verbs;
