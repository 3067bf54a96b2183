//! Uprobe targets by file offset, resolved from the ELF dynamic symbol table with symbol
//! versions: a library like libibverbs exports `ibv_reg_mr` twice, a compat `@IBVERBS_1.0`
//! stub and the default `@@IBVERBS_1.1` that programs bind to. Attaching by name (aya's own
//! lookup takes the first match) can hook the stub and see nothing; this module takes the
//! default version (the entry whose `.gnu.version` index lacks the hidden bit) and turns its
//! address into the file offset the kernel wants (`vaddr - PT_LOAD.p_vaddr + p_offset`).

use std::path::{Path, PathBuf};

use object::elf::{FileHeader64, PT_LOAD, SHN_UNDEF, SHT_DYNSYM, STT_FUNC, STT_GNU_IFUNC};
use object::read::elf::{FileHeader, ProgramHeader, Sym};
use object::Endianness;

/// Why a symbol could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum SymbolError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a 64-bit ELF shared object: {reason}")]
    Elf { path: PathBuf, reason: String },
    #[error("{path} does not export function {name}")]
    Missing { path: PathBuf, name: String },
    #[error("{path} exports {name} only as hidden compat versions ({versions})")]
    OnlyCompat {
        path: PathBuf,
        name: String,
        versions: String,
    },
    #[error("{path}: the address {vaddr:#x} of {name} lies in no PT_LOAD segment")]
    NotLoaded {
        path: PathBuf,
        name: String,
        vaddr: u64,
    },
}

/// One exported function of a shared object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DynFunction {
    pub name: String,
    /// Its symbol version (`IBVERBS_1.1`), when the object versions its symbols.
    pub version: Option<String>,
    /// True for the default version (`@@`) or an unversioned symbol; false for a hidden compat one.
    pub default: bool,
    /// The symbol's value (virtual address in the object).
    pub vaddr: u64,
    /// The file offset a uprobe attaches at.
    pub file_offset: u64,
}

impl DynFunction {
    /// `name@@VERSION`, `name@VERSION` or `name`.
    pub fn versioned_name(&self) -> String {
        match &self.version {
            Some(v) if self.default => format!("{}@@{v}", self.name),
            Some(v) => format!("{}@{v}", self.name),
            None => self.name.clone(),
        }
    }
}

fn elf_err(path: &Path, e: impl std::fmt::Display) -> SymbolError {
    SymbolError::Elf {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

/// Every defined function (and IFUNC) in the dynamic symbol table of the object at `path`.
pub fn dynamic_functions(path: &Path) -> Result<Vec<DynFunction>, SymbolError> {
    let data = std::fs::read(path).map_err(|source| SymbolError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(path, &data)
}

fn parse(path: &Path, data: &[u8]) -> Result<Vec<DynFunction>, SymbolError> {
    let header = FileHeader64::<Endianness>::parse(data).map_err(|e| elf_err(path, e))?;
    let endian = header.endian().map_err(|e| elf_err(path, e))?;
    let sections = header
        .sections(endian, data)
        .map_err(|e| elf_err(path, e))?;
    let syms = sections
        .symbols(endian, data, SHT_DYNSYM)
        .map_err(|e| elf_err(path, e))?;
    let versions = sections
        .versions(endian, data)
        .map_err(|e| elf_err(path, e))?;
    let loads: Vec<(u64, u64, u64)> = header
        .program_headers(endian, data)
        .map_err(|e| elf_err(path, e))?
        .iter()
        .filter(|p| p.p_type(endian) == PT_LOAD)
        .map(|p| (p.p_vaddr(endian), p.p_memsz(endian), p.p_offset(endian)))
        .collect();
    let mut out = Vec::new();
    for (index, sym) in syms.enumerate() {
        let kind = sym.st_type();
        if sym.st_shndx(endian) == SHN_UNDEF || (kind != STT_FUNC && kind != STT_GNU_IFUNC) {
            continue;
        }
        let name = sym
            .name(endian, syms.strings())
            .map_err(|e| elf_err(path, e))?;
        let name = String::from_utf8_lossy(name).into_owned();
        let (version, default) = match &versions {
            Some(v) => {
                let vi = v.version_index(endian, index);
                let ver = v.version(vi).map_err(|e| elf_err(path, e))?;
                (
                    ver.map(|x| String::from_utf8_lossy(x.name()).into_owned()),
                    !vi.is_hidden(),
                )
            }
            None => (None, true),
        };
        let vaddr = sym.st_value(endian);
        let Some(&(base, _, off)) = loads
            .iter()
            .find(|(va, size, _)| vaddr >= *va && vaddr < va + size)
        else {
            return Err(SymbolError::NotLoaded {
                path: path.to_path_buf(),
                name,
                vaddr,
            });
        };
        out.push(DynFunction {
            name,
            version,
            default,
            vaddr,
            file_offset: vaddr - base + off,
        });
    }
    Ok(out)
}

/// The default version of function `name` among `funcs` (from [`dynamic_functions`] of `path`).
pub fn resolve<'a>(
    path: &Path,
    funcs: &'a [DynFunction],
    name: &str,
) -> Result<&'a DynFunction, SymbolError> {
    let all: Vec<&DynFunction> = funcs.iter().filter(|f| f.name == name).collect();
    if all.is_empty() {
        return Err(SymbolError::Missing {
            path: path.to_path_buf(),
            name: name.to_string(),
        });
    }
    all.iter()
        .find(|f| f.default)
        .copied()
        .ok_or_else(|| SymbolError::OnlyCompat {
            path: path.to_path_buf(),
            name: name.to_string(),
            versions: all
                .iter()
                .map(|f| f.versioned_name())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// The first function called `name` in table order: what a lookup by plain name finds (aya's
/// `UProbeAttachLocation::Symbol`), kept to show the difference (`probe --attach-by-name`).
pub fn first_by_name<'a>(funcs: &'a [DynFunction], name: &str) -> Option<&'a DynFunction> {
    funcs.iter().find(|f| f.name == name)
}

/// Where the dynamic loader would find `soname`: the directories of `/etc/ld.so.cache`'s usual
/// multiarch layout on Debian, then `/usr/lib64` and `/usr/lib`.
pub fn find_library(soname: &str) -> Option<PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu",
        "/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
    ]
    .iter()
    .map(|d| Path::new(d).join(soname))
    .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_non_elf_file_is_a_one_line_error() {
        let e = parse(Path::new("/x/lib.so"), b"not an elf").unwrap_err();
        assert!(
            e.to_string().starts_with("/x/lib.so is not a 64-bit ELF"),
            "{e}"
        );
    }

    #[test]
    fn libc_resolves_its_default_versions() {
        let Some(libc) = find_library("libc.so.6") else {
            panic!("no libc.so.6 in the usual directories");
        };
        let funcs = dynamic_functions(&libc).unwrap();
        // glibc exports `realpath` as realpath@GLIBC_2.2.5 (compat) and realpath@@GLIBC_2.3.
        let f = resolve(&libc, &funcs, "realpath").unwrap();
        assert!(f.default, "{f:?}");
        assert!(f.version.as_deref().unwrap().starts_with("GLIBC_"), "{f:?}");
        let all: Vec<_> = funcs.iter().filter(|f| f.name == "realpath").collect();
        assert!(
            all.len() >= 2,
            "realpath has a compat and a default version: {all:?}"
        );
        assert!(all.iter().any(|f| !f.default));
        assert!(f.file_offset > 0);
        assert!(matches!(
            resolve(&libc, &funcs, "no_such_function_here"),
            Err(SymbolError::Missing { .. })
        ));
    }
}
