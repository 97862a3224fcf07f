//! Finding a symbol in the objects already loaded, by reading their dynamic symbol tables in
//! memory: how [`crate::exports::dl`] gets libc's real `dlsym`/`dlvsym` while its own exports of those
//! names shadow them (glibc has no other public or private name for them, and asking `dlsym`
//! for `dlsym` would call the shim itself), and [`crate::sys::symbols`]'s last resort for a library
//! loaded where neither `RTLD_NEXT` nor its soname finds it.
//!
//! Reads what the dynamic linker reads: `PT_DYNAMIC` → `DT_SYMTAB`, `DT_STRTAB`, and
//! `DT_GNU_HASH` (or the older `DT_HASH`), `DT_VERSYM` to prefer a symbol's default version.
//! No allocation, no lock of ours, no file access: it may run inside the first `dlsym` call a
//! program makes.
use std::ffi::{c_int, c_void, CStr};

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const DT_NULL: i64 = 0;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;
const STT_FUNC: u8 = 2;
/// `DT_VERSYM` entries with this bit are non-default versions (`name@VER`, not `name@@VER`).
const VERSYM_HIDDEN: u16 = 0x8000;

#[repr(C)]
struct Dyn {
    tag: i64,
    val: u64,
}

#[repr(C)]
struct Sym {
    name: u32,
    info: u8,
    other: u8,
    shndx: u16,
    value: u64,
    size: u64,
}

/// The dynamic tables of one loaded object.
struct Tables {
    base: usize,
    symtab: *const Sym,
    strtab: *const u8,
    gnu_hash: *const u32,
    hash: *const u32,
    versym: *const u16,
}

/// The address of function `name` (its default version where it has several) in the first
/// loaded object, in load order, whose file name starts with one of `objects` (e.g.
/// `libc.so`), that defines it and does not contain `skip` (an address in the caller's own
/// object). None if no object does.
pub fn find_function(name: &CStr, objects: &[&str], skip: *const c_void) -> Option<*mut c_void> {
    struct Search<'a> {
        name: &'a CStr,
        objects: &'a [&'a str],
        skip: usize,
        found: usize,
    }
    unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
        // SAFETY: dl_iterate_phdr hands us a valid info for this object and our own `data`.
        let (info, search) = unsafe { (&*info, &mut *(data as *mut Search)) };
        if !search.objects.iter().any(|o| named(info, o)) {
            return 0;
        }
        // SAFETY: the program headers of a loaded object, as the dynamic linker mapped them.
        let found = unsafe { lookup_in(info, search.name, search.skip) };
        match found {
            Some(addr) => {
                search.found = addr;
                1 // stop
            }
            None => 0,
        }
    }
    let mut search = Search {
        name,
        objects,
        skip: skip as usize,
        found: 0,
    };
    // SAFETY: `each` only reads the objects' mapped tables; `search` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut search as *mut Search as *mut c_void) };
    (search.found != 0).then_some(search.found as *mut c_void)
}

/// Whether the object's file name (its last path component) starts with `prefix`.
fn named(info: &libc::dl_phdr_info, prefix: &str) -> bool {
    if info.dlpi_name.is_null() {
        return false;
    }
    // SAFETY: the loader's C string for this object.
    let path = unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes();
    let base = path.rsplit(|&c| c == b'/').next().unwrap_or(path);
    base.starts_with(prefix.as_bytes())
}

/// `name` in the object `info` describes, unless that object contains address `skip`.
unsafe fn lookup_in(info: &libc::dl_phdr_info, name: &CStr, skip: usize) -> Option<usize> {
    let base = info.dlpi_addr as usize;
    let phdrs = std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize);
    let contains_skip = phdrs.iter().any(|p| {
        let start = base + p.p_vaddr as usize;
        p.p_type == PT_LOAD && (start..start + p.p_memsz as usize).contains(&skip)
    });
    if contains_skip {
        return None;
    }
    let dynamic = phdrs.iter().find(|p| p.p_type == PT_DYNAMIC)?;
    let tables = tables(base, (base + dynamic.p_vaddr as usize) as *const Dyn)?;
    let index = if !tables.gnu_hash.is_null() {
        gnu_lookup(&tables, name)
    } else if !tables.hash.is_null() {
        sysv_lookup(&tables, name)
    } else {
        None
    }?;
    Some(tables.base + (*tables.symtab.add(index as usize)).value as usize)
}

unsafe fn tables(base: usize, mut d: *const Dyn) -> Option<Tables> {
    // glibc stores these relocated (absolute); other loaders and the vDSO leave them as
    // offsets from the load address.
    let address = |v: u64| {
        let v = v as usize;
        if v < base {
            v + base
        } else {
            v
        }
    };
    let mut t = Tables {
        base,
        symtab: std::ptr::null(),
        strtab: std::ptr::null(),
        gnu_hash: std::ptr::null(),
        hash: std::ptr::null(),
        versym: std::ptr::null(),
    };
    while (*d).tag != DT_NULL {
        let v = (*d).val;
        match (*d).tag {
            DT_SYMTAB => t.symtab = address(v) as *const Sym,
            DT_STRTAB => t.strtab = address(v) as *const u8,
            DT_GNU_HASH => t.gnu_hash = address(v) as *const u32,
            DT_HASH => t.hash = address(v) as *const u32,
            DT_VERSYM => t.versym = address(v) as *const u16,
            _ => {}
        }
        d = d.add(1);
    }
    (!t.symtab.is_null() && !t.strtab.is_null()).then_some(t)
}

/// Whether symbol `index` is a defined function called `name`; `Some(true)` if it is also
/// the default version.
unsafe fn matches(t: &Tables, index: u32, name: &CStr) -> Option<bool> {
    let sym = &*t.symtab.add(index as usize);
    if sym.shndx == 0 || sym.info & 0xf != STT_FUNC || sym.value == 0 {
        return None;
    }
    let sym_name = CStr::from_ptr(t.strtab.add(sym.name as usize) as *const _);
    if sym_name != name {
        return None;
    }
    Some(t.versym.is_null() || *t.versym.add(index as usize) & VERSYM_HIDDEN == 0)
}

/// Of the candidates a hash chain yields, the default version, else the first one.
fn prefer_default(best: &mut Option<(u32, bool)>, index: u32, default: bool) {
    if best.is_none_or(|(_, d)| !d && default) {
        *best = Some((index, default));
    }
}

/// GNU hash table: `nbuckets, symoffset, bloom_size, bloom_shift`, the bloom words, the
/// buckets, then one chain word per symbol from `symoffset` (low bit: end of chain).
unsafe fn gnu_lookup(t: &Tables, name: &CStr) -> Option<u32> {
    let h = name
        .to_bytes()
        .iter()
        .fold(5381u32, |h, &c| h.wrapping_mul(33).wrapping_add(c as u32));
    let header = t.gnu_hash;
    let (nbuckets, symoffset, bloom_size) = (*header, *header.add(1), *header.add(2));
    if nbuckets == 0 {
        return None;
    }
    let buckets = header.add(4 + 2 * bloom_size as usize); // 64-bit bloom words
    let chains = buckets.add(nbuckets as usize);
    let mut index = *buckets.add((h % nbuckets) as usize);
    if index < symoffset {
        return None;
    }
    let mut best = None;
    loop {
        let chain = *chains.add((index - symoffset) as usize);
        if chain | 1 == h | 1 {
            if let Some(default) = matches(t, index, name) {
                prefer_default(&mut best, index, default);
            }
        }
        if chain & 1 != 0 {
            break;
        }
        index += 1;
    }
    best.map(|(i, _)| i)
}

/// SysV hash table: `nbucket, nchain`, the buckets, the chains.
unsafe fn sysv_lookup(t: &Tables, name: &CStr) -> Option<u32> {
    let h = name.to_bytes().iter().fold(0u32, |h, &c| {
        let h = (h << 4).wrapping_add(c as u32);
        let g = h & 0xf000_0000;
        (h ^ (g >> 24)) & !g
    });
    let (nbucket, nchain) = (*t.hash, *t.hash.add(1));
    if nbucket == 0 {
        return None;
    }
    let buckets = t.hash.add(2);
    let chains = buckets.add(nbucket as usize);
    let mut index = *buckets.add((h % nbucket) as usize);
    let mut best = None;
    while index != 0 && index < nchain {
        if let Some(default) = matches(t, index, name) {
            prefer_default(&mut best, index, default);
        }
        index = *chains.add(index as usize);
    }
    best.map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the dynamic linker itself answers, through a name the shim does not export.
    fn by_dlvsym(name: &CStr, version: &CStr) -> *mut c_void {
        let h = unsafe { libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        assert!(!h.is_null());
        unsafe { libc::dlvsym(h, name.as_ptr(), version.as_ptr()) }
    }

    #[test]
    fn finds_libc_functions_where_the_dynamic_linker_does() {
        let here = finds_libc_functions_where_the_dynamic_linker_does as *const c_void;
        for name in [c"dlsym", c"dlvsym", c"getpid", c"dl_iterate_phdr"] {
            let found = find_function(name, &["libc.so"], here).expect("found");
            // glibc 2.34 moved the dl* functions into libc (GLIBC_2.34 is their default).
            let version = if name.to_bytes().starts_with(b"dl") && name != c"dl_iterate_phdr" {
                c"GLIBC_2.34"
            } else {
                c"GLIBC_2.2.5"
            };
            assert_eq!(found, by_dlvsym(name, version), "{name:?}");
        }
    }

    #[test]
    fn a_name_nobody_defines_is_not_found() {
        let here = a_name_nobody_defines_is_not_found as *const c_void;
        assert_eq!(
            find_function(c"ibjitter_no_such_function", &["lib"], here),
            None
        );
        // Only the objects named are searched.
        assert_eq!(
            find_function(c"getpid", &["libibjitter-nothing"], here),
            None
        );
    }
}
