//! Layer 8: what the shim puts in the provider's place: the post wrappers ([`post`]), the
//! `ibv_wr_*` work-request wrappers ([`wr_ops`]), the pointer swaps that install them
//! ([`patch`]), and the UCP layer's wait ([`ucp`]).
pub mod patch;
pub mod post;
pub mod ucp;
pub mod wr_ops;
