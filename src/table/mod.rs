//! Delay tables: 4096 integers in 512 lines of 8, the shape of tc netem's `.dist` files.
