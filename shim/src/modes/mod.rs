//! Layer 7: the modes that act on posts and completions beyond the draw's busy-wait:
//! selection ([`select`]), the injection window ([`window`]), the delay line ([`line`]),
//! completion-side delay ([`cq`], [`cq_ex`] for the extended poll API, both holding
//! completions in a [`hold`] ring).
pub mod cq;
pub mod cq_ex;
pub mod hold;
pub mod line;
pub mod select;
pub mod window;
