//! The SDK's modules are layered one way: every `crate::<module>` a module's code names (in
//! `use` lines and in paths) is of a lower layer, so the module graph has no cycle. Read from
//! the sources; comments and doc attributes (doc links included) do not count, as they are no
//! dependency.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The layers, lowest first; a module may use the modules of lower layers only.
const LAYERS: &[&[&str]] = &[
    &["error"],
    &["options", "paths"],
    &["token"],
    &["transport"],
    &["connection", "exec"],
    &["claims"],
    &["pools", "logs", "kubeconfig"],
    &["sandbox"],
    &["client"],
    &["handle"],
    &["args", "fake"],
];

/// The crate modules named by `crate::<name>` in `source`, outside comments.
fn used_modules(source: &str, modules: &BTreeSet<&str>) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    for line in source.lines() {
        let code = line.split("//").next().unwrap_or_default();
        if code.contains("doc = \"") {
            continue;
        }
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if modules.contains(name.as_str()) {
                used.insert(name);
            }
        }
        // `use crate::{a, b}` lists several modules at once.
        if let Some(list) = code.trim().strip_prefix("use crate::{") {
            for name in list.split([',', '}', ':', ' ']) {
                if modules.contains(name) {
                    used.insert(name.to_owned());
                }
            }
        }
    }
    used
}

fn sources() -> BTreeMap<String, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            files.insert(name, std::fs::read_to_string(&path).unwrap());
        }
    }
    // A module's submodules (`dir/file.rs`) belong to it.
    for (module, text) in files.iter_mut() {
        let dir = src.join(module.as_str());
        if dir.is_dir() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                text.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap());
            }
        }
    }
    files
}

#[test]
fn every_module_uses_only_lower_layers() {
    let files = sources();
    let layer_of: BTreeMap<&str, usize> = LAYERS
        .iter()
        .enumerate()
        .flat_map(|(layer, names)| names.iter().map(move |name| (*name, layer)))
        .collect();
    let modules: BTreeSet<&str> = layer_of.keys().copied().collect();
    let on_disk: BTreeSet<&str> = files
        .keys()
        .map(String::as_str)
        .filter(|name| *name != "lib")
        .collect();
    assert_eq!(
        on_disk, modules,
        "every module of src/ has a layer in LAYERS"
    );
    let mut wrong = Vec::new();
    for (module, text) in &files {
        let Some(&layer) = layer_of.get(module.as_str()) else {
            continue;
        };
        for used in used_modules(text, &modules) {
            if used != *module && layer_of[used.as_str()] >= layer {
                wrong.push(format!("{module} uses {used}"));
            }
        }
    }
    assert!(wrong.is_empty(), "upward or sideways uses: {wrong:?}");
}

#[test]
fn the_reader_sees_uses_in_code_and_not_in_comments() {
    let modules = BTreeSet::from(["client", "sandbox", "token", "error"]);
    let text = "use crate::client::Client;\n\
                /// [`x`](crate::sandbox::Sandbox)\n\
                let t = crate::token::mint(); // crate::error\n\
                #[cfg_attr(feature = \"fake\", doc = \"[`x`](crate::sandbox::X)\")]\n\
                use crate::{error, options};\n";
    assert_eq!(
        used_modules(text, &modules),
        BTreeSet::from(["client".to_owned(), "error".to_owned(), "token".to_owned()])
    );
}
