//! Generates the libibverbs struct layouts the shim patches (from <infiniband/verbs.h>),
//! narrowly: types only, no functions, so nothing links libibverbs.
use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=/usr/include/infiniband/verbs.h");
    let bindings = bindgen::Builder::default()
        .header_contents("wrapper.h", "#include <infiniband/verbs.h>\n")
        .allowlist_type("ibv_context|verbs_context|ibv_qp|ibv_qp_ex|ibv_qp_init_attr|ibv_qp_init_attr_ex|ibv_send_wr|ibv_device|ibv_pd|ibv_qp_attr")
        .allowlist_type("ibv_qp_attr_mask|ibv_qp_init_attr_mask|ibv_qp_create_send_ops_flags|ibv_send_flags|ibv_sge")
        .layout_tests(true)
        .derive_debug(false)
        .derive_default(false)
        .generate_comments(false)
        .generate()
        .expect("bindgen could not read <infiniband/verbs.h> (is libibverbs-dev installed?)");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("verbs.rs");
    bindings.write_to_file(out).expect("write verbs.rs");
}
