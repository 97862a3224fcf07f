//! The `ibjitter` command line: parsing lives in `cli/`, the work in the library.
mod cli;

fn main() {
    std::process::exit(cli::main());
}
