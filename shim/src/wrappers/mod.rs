//! Layer 8: what the shim puts in the provider's place: the post wrappers ([`post`]), the
//! `ibv_wr_*` work-request wrappers ([`wr_ops`]), and the pointer swaps that install them
//! ([`patch`]).
pub mod patch;
pub mod post;
pub mod wr_ops;
