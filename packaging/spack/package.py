# Spack recipe for ibjitter: installs the layout of tools/install under Spack's prefix
# (bin/ibjitter, lib/ibjitter/libibjitter.so, share/ibjitter/distributions/, man pages,
# bash/zsh/fish completions) by running tools/install itself, so the two cannot drift.
#
# What was checked about this file, plainly: Spack was NOT run (it is not on PyPI and this
# machine has no other network). The file compiles as Python (python3 -m py_compile), and
# tests/install.rs checks the command it runs (tools/install --prefix on the offline bundle
# that tools/release makes). The directive names (depends_on, version, url, sha256) follow
# Spack's documented Package API; untested against a real Spack, including the dependency
# names (rust, rdma-core, llvm for libclang) and the sha256, which must be filled in for
# each release bundle.
#
# Use: put this file at <your spack repo>/packages/ibjitter/package.py, set `url` to where
# you keep the bundle of tools/release, its sha256 below, then `spack install ibjitter`.
from spack.package import *


class Ibjitter(Package):
    """RDMA latency and latency-variation toolkit: an LD_PRELOAD latency injector
    (libibjitter.so, run a program under it with `ibjitter exec`), delay tables, a many-flow
    RDMA traffic generator, incast, capture analysis and sensitivity studies."""

    # homepage: to be set to where the project is published (not known to this recipe).
    # The offline bundle of tools/release (sources, Cargo.lock, vendored crates): builds
    # with no network, as Spack build nodes often have none.
    url = "file:///path/to/ibjitter-0.1.0-COMMIT.tar.gz"

    license("MIT OR Apache-2.0")

    # Fill in with `sha256sum` of the bundle you put at `url`.
    version("0.1.0", sha256="0" * 64)

    depends_on("rust@1.85:", type="build")
    depends_on("c", type="build")
    # rdma-sys and the shim generate their bindings from <infiniband/verbs.h> with bindgen,
    # which needs libclang.
    depends_on("llvm", type="build")
    depends_on("pkgconfig", type="build")
    depends_on("rdma-core")

    def setup_build_environment(self, env):
        # Vendored crates only (the bundle's .cargo/config.toml), never the network.
        env.set("CARGO_NET_OFFLINE", "true")
        env.set("CARGO_HOME", join_path(self.stage.path, "cargo-home"))
        env.set("LIBCLANG_PATH", self.spec["llvm"].prefix.lib)

    def install(self, spec, prefix):
        install_script = Executable(join_path(self.stage.source_path, "tools", "install"))
        install_script("--prefix", prefix)

    @run_after("install")
    @on_package_attributes(run_tests=True)
    def check_installed(self):
        # The installed binary finds its installed shim and runs a program under it.
        ibjitter = Executable(self.prefix.bin.ibjitter)
        ibjitter("exec", "--delay", "100us", "--", "/bin/true")
