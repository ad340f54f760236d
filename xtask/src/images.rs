//! `cargo xtask images`: builds the four images of the root `Dockerfile` (one target each) and
//! tags them; optionally pushes them and pins the release manifests to their digests.
//! `--check-requirements` checks, without Docker, that the Python libraries of the
//! `python-runtime-sandbox` image install as pinned. `--oci DIR` builds the controller, router
//! and runtime images without Docker, as OCI archives ([`oci`]); `--lock` pins their Debian
//! packages ([`debian`]).

mod deb;
pub(crate) mod debian;
mod layout;
pub(crate) mod oci;
mod rootfs;
pub(crate) mod spec;

use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, Result, bail};

/// One image: its Dockerfile target, local name (what `deploy/overlays/kind` and `flux/kind`
/// use) and published name (what `deploy/overlays/release` and `flux/release` use).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Image {
    pub(crate) target: &'static str,
    pub(crate) local: &'static str,
    pub(crate) published: &'static str,
    /// Named by the release manifests (and so pinned there); the others are for users' own
    /// templates.
    pub(crate) in_release: bool,
}

/// The images, in build order.
pub(crate) const IMAGES: [Image; 4] = [
    Image {
        target: "controller",
        local: "agent-sandbox/controller",
        published: "agent-sandbox-controller",
        in_release: true,
    },
    Image {
        target: "router",
        local: "agent-sandbox/router",
        published: "sandbox-router",
        in_release: true,
    },
    Image {
        target: "runtime",
        local: "agent-sandbox/runtime-python",
        published: "sandbox-runtime-python",
        in_release: true,
    },
    Image {
        target: PYTHON_RUNTIME_SANDBOX,
        local: "agent-sandbox/python-runtime-sandbox",
        published: "python-runtime-sandbox",
        in_release: false,
    },
];

/// The target (and image name) of our runtime in the environment of upstream's
/// `python-runtime-sandbox` image.
pub(crate) const PYTHON_RUNTIME_SANDBOX: &str = "python-runtime-sandbox";

/// Its Python libraries: the pins users edit, and the hash-pinned file generated from them
/// (`crates/runtime/image/python-runtime-sandbox/README.md`).
pub(crate) const PYTHON_RUNTIME_REQUIREMENTS_IN: &str =
    "crates/runtime/image/python-runtime-sandbox/requirements.in";
pub(crate) const PYTHON_RUNTIME_REQUIREMENTS: &str =
    "crates/runtime/image/python-runtime-sandbox/requirements.txt";

/// The interpreter and machines the image is built for: Python 3.14 (upstream's base,
/// `python:3.14-slim`) on Linux x86_64 and aarch64.
const PYTHON_RUNTIME_PYTHON: &str = "3.14";
const PYTHON_RUNTIME_ABI: &str = "cp314";
const PYTHON_RUNTIME_ARCHES: [&str; 2] = ["x86_64", "aarch64"];

/// `cargo xtask images --check-requirements`: downloads every pinned wheel for the image's
/// Python on each architecture with `pip download --require-hashes` into a scratch directory,
/// which fails (naming the package) where a pin has no wheel or a hash does not match, as the
/// image's `pip install` would. Needs `python3 -m pip` and the package index, not Docker.
pub(crate) fn check_requirements(root: &Path) -> Result<Vec<String>> {
    let read = |path: &str| {
        std::fs::read_to_string(root.join(path)).with_context(|| format!("failed to read {path}"))
    };
    let requirements = root.join(PYTHON_RUNTIME_REQUIREMENTS);
    let mut pins = parse_pins(&read(PYTHON_RUNTIME_REQUIREMENTS)?);
    let mut wanted = parse_pins(&read(PYTHON_RUNTIME_REQUIREMENTS_IN)?);
    pins.sort();
    wanted.sort();
    if pins != wanted {
        bail!(
            "{PYTHON_RUNTIME_REQUIREMENTS} pins {pins:?}, but {PYTHON_RUNTIME_REQUIREMENTS_IN} asks for {wanted:?}: regenerate it as crates/runtime/image/python-runtime-sandbox/README.md says"
        );
    }
    let mut lines = Vec::new();
    for arch in PYTHON_RUNTIME_ARCHES {
        let scratch = tempfile::tempdir().context("failed to create a scratch directory")?;
        let mut command = Command::new("python3");
        command
            .args([
                "-m",
                "pip",
                "download",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(["--no-deps", "--require-hashes", "--only-binary=:all:"])
            .args([
                "--python-version",
                PYTHON_RUNTIME_PYTHON,
                "--implementation",
                "cp",
            ])
            .args([
                "--abi",
                PYTHON_RUNTIME_ABI,
                "--abi",
                "abi3",
                "--abi",
                "none",
            ]);
        // manylinux tags from the oldest to Debian 13's glibc 2.41, as pip would accept there.
        command.args(["--platform", &format!("manylinux2014_{arch}")]);
        for minor in 17..=41 {
            command.args(["--platform", &format!("manylinux_2_{minor}_{arch}")]);
        }
        command
            .arg("-r")
            .arg(&requirements)
            .arg("-d")
            .arg(scratch.path());
        eprintln!(
            "downloading {} pinned wheels for CPython {PYTHON_RUNTIME_PYTHON} on linux/{arch} ...",
            pins.len()
        );
        run(&mut command).with_context(|| {
            format!(
                "the pins of {PYTHON_RUNTIME_REQUIREMENTS} do not install on CPython                  {PYTHON_RUNTIME_PYTHON} linux/{arch}; regenerate them as its README says"
            )
        })?;
        let wheels = std::fs::read_dir(scratch.path())?.count();
        if wheels != pins.len() {
            bail!(
                "{wheels} wheels downloaded for linux/{arch}, but {PYTHON_RUNTIME_REQUIREMENTS} pins {} packages",
                pins.len()
            );
        }
        lines.push(format!(
            "{PYTHON_RUNTIME_SANDBOX}: {wheels} wheels with matching hashes for CPython {PYTHON_RUNTIME_PYTHON} linux/{arch}"
        ));
    }
    Ok(lines)
}

/// The `name==version` pins of a requirements file (comments, hashes and blank lines skipped),
/// names lower-cased.
pub(crate) fn parse_pins(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(|line| line.split('#').next().unwrap_or_default().trim())
        .filter_map(|line| {
            let line = line.trim_end_matches('\\').trim();
            let (name, version) = line.split_once("==")?;
            Some((name.trim().to_lowercase(), version.trim().to_owned()))
        })
        .collect()
}

/// The local tag the kind overlay expects.
pub(crate) const DEV_TAG: &str = "dev";

/// What to build.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    /// Tag of every image.
    pub(crate) tag: String,
    /// Registry prefix (`ghcr.io/agent-sandbox-rs`); the local names when `None`.
    pub(crate) registry: Option<String>,
    /// Push after building (needs `registry`).
    pub(crate) push: bool,
    /// Write the pushed digests into the release overlay and Flux release objects.
    pub(crate) pin_release: bool,
}

impl Options {
    /// Local `agent-sandbox/*:dev` images, neither pushed nor pinned (kind and k3s load them).
    pub(crate) fn dev() -> Self {
        Self {
            tag: DEV_TAG.to_owned(),
            registry: None,
            push: false,
            pin_release: false,
        }
    }
}

/// `<registry>/<published>:<tag>`, or `<local>:<tag>` without a registry.
pub(crate) fn reference(image: &Image, options: &Options) -> String {
    match &options.registry {
        Some(registry) => format!(
            "{}/{}:{}",
            registry.trim_end_matches('/'),
            image.published,
            options.tag
        ),
        None => format!("{}:{}", image.local, options.tag),
    }
}

/// Fails with instructions unless the `docker` CLI is installed and its daemon answers.
pub(crate) fn require_docker() -> Result<()> {
    match Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .output()
    {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => bail!(
            "docker is not installed: building images needs Docker (or a Docker-compatible CLI with BuildKit).\n\
             Install it from https://docs.docker.com/engine/install/ and run `cargo xtask images` again.\n\
             Nothing else in this repository needs Docker: `cargo test --workspace` runs on the simulated cluster."
        ),
        Err(error) => Err(error).context("failed to run `docker info`"),
        Ok(output) if !output.status.success() => bail!(
            "the Docker daemon is not reachable (`docker info` failed: {}).\n\
             Start Docker (e.g. `sudo systemctl start docker`, or Docker Desktop) and run the command again.",
            String::from_utf8_lossy(&output.stderr).trim()
        ),
        Ok(_) => Ok(()),
    }
}

/// Runs a command, echoing it; fails naming it.
pub(crate) fn run(command: &mut Command) -> Result<()> {
    eprintln!("+ {}", show(command));
    let status = command
        .status()
        .with_context(|| format!("failed to start `{}`", show(command)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", show(command));
    }
    Ok(())
}

/// A command as a shell-like line, for messages.
pub(crate) fn show(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|s| s.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Builds (and optionally pushes and pins) every image; returns the references built.
pub(crate) fn build(root: &Path, options: &Options) -> Result<Vec<String>> {
    if options.push && options.registry.is_none() {
        bail!("--push needs --registry (where to push)");
    }
    if options.pin_release && !options.push {
        bail!("--pin-release needs --push (digests exist once pushed)");
    }
    require_docker()?;
    let mut built = Vec::new();
    for image in &IMAGES {
        let reference = reference(image, options);
        run(Command::new("docker")
            .current_dir(root)
            .env("DOCKER_BUILDKIT", "1")
            .args(["build", "--file", "Dockerfile", "--target", image.target])
            .args(["--tag", &reference, "."]))?;
        built.push(reference);
    }
    if options.push {
        for (image, reference) in IMAGES.iter().zip(&built) {
            run(Command::new("docker").args(["push", reference]))?;
            if options.pin_release && image.in_release {
                let digest = pushed_digest(reference)?;
                let registry = options.registry.as_deref().unwrap_or_default();
                let name = format!("{}/{}", registry.trim_end_matches('/'), image.published);
                pin_everywhere(root, &name, &digest)?;
            }
        }
    }
    Ok(built)
}

/// The `sha256:...` digest the registry gave a pushed reference.
fn pushed_digest(reference: &str) -> Result<String> {
    let output = Command::new("docker")
        .args([
            "image",
            "inspect",
            "--format",
            "{{range .RepoDigests}}{{println .}}{{end}}",
            reference,
        ])
        .output()
        .context("failed to run `docker image inspect`")?;
    let repository = reference.rsplit_once(':').map_or(reference, |(r, _)| r);
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{repository}@")))
        .map(str::to_owned)
        .with_context(|| format!("no registry digest for {reference} after pushing it"))
}

/// Files whose `images:` entries (or, in the chart's values, `image:` maps) carry release
/// digests.
pub(crate) const RELEASE_FILES: [&str; 5] = [
    "deploy/overlays/release/kustomization.yaml",
    "deploy/helm/agent-sandbox/values.yaml",
    "flux/release/controller.yaml",
    "flux/release/sandboxes.yaml",
    "flux/release-helm/helmrelease.yaml",
];

fn pin_everywhere(root: &Path, name: &str, digest: &str) -> Result<()> {
    for file in RELEASE_FILES {
        let path = root.join(file);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("failed to read {}", path.display()))?;
        let pinned = pin(&text, name, digest);
        if pinned != text {
            std::fs::write(&path, pinned)
                .with_context(|| format!("failed to write {}", path.display()))?;
            eprintln!("pinned {name}@{digest} in {file}");
        }
    }
    Ok(())
}

/// Replaces the `digest:` that follows `newName: <name>` in an `images:` list (or
/// `repository: <name>` in the chart's values).
pub(crate) fn pin(text: &str, name: &str, digest: &str) -> String {
    let mut out = Vec::new();
    let mut armed = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let names = |key: &str| trimmed.strip_prefix(key).map(str::trim) == Some(name);
        if names("newName:") || names("repository:") {
            armed = true;
        } else if armed && trimmed.starts_with("digest:") {
            let indent = &line[..line.len() - trimmed.len()];
            out.push(format!("{indent}digest: {digest}"));
            armed = false;
            continue;
        } else if trimmed.starts_with("- ") {
            armed = false;
        }
        out.push(line.to_owned());
    }
    let mut joined = out.join("\n");
    if text.ends_with('\n') {
        joined.push('\n');
    }
    joined
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_replaces_only_the_named_image() {
        let text = "images:\n  - name: a\n    newName: r.io/x/a\n    digest: sha256:00\n  - name: b\n    newName: r.io/x/b\n    digest: sha256:00\n";
        let pinned = pin(text, "r.io/x/b", "sha256:ff");
        assert_eq!(
            pinned,
            "images:\n  - name: a\n    newName: r.io/x/a\n    digest: sha256:00\n  - name: b\n    newName: r.io/x/b\n    digest: sha256:ff\n"
        );
        let values =
            "router:\n  image:\n    repository: r.io/x/b\n    tag: \"\"\n    digest: sha256:00\n";
        assert_eq!(
            pin(values, "r.io/x/b", "sha256:ff"),
            "router:\n  image:\n    repository: r.io/x/b\n    tag: \"\"\n    digest: sha256:ff\n"
        );
    }

    #[test]
    fn release_files_name_every_published_image() {
        let root = crate::workspace_root();
        let all: String = RELEASE_FILES
            .iter()
            .map(|f| std::fs::read_to_string(root.join(f)).unwrap())
            .collect();
        for image in IMAGES.iter().filter(|image| image.in_release) {
            let name = format!("ghcr.io/agent-sandbox-rs/{}", image.published);
            assert!(all.contains(&format!("newName: {name}")), "{name}");
        }
    }

    #[test]
    fn references() {
        let local = Options {
            tag: DEV_TAG.into(),
            registry: None,
            push: false,
            pin_release: false,
        };
        assert_eq!(
            reference(&IMAGES[0], &local),
            "agent-sandbox/controller:dev"
        );
        let published = Options {
            registry: Some("ghcr.io/agent-sandbox-rs/".into()),
            tag: "v1".into(),
            ..local
        };
        assert_eq!(
            reference(&IMAGES[2], &published),
            "ghcr.io/agent-sandbox-rs/sandbox-runtime-python:v1"
        );
    }

    /// The libraries (and versions) of upstream's `examples/python-runtime-sandbox` image at
    /// v1.0.3, from its `requirements.txt`, without its server stack (fastapi, uvicorn,
    /// python-multipart and their dependencies).
    const UPSTREAM_V1_0_3_LIBRARIES: [(&str, &str); 10] = [
        ("joblib", "1.5.3"),
        ("lightgbm", "4.6.0"),
        ("narwhals", "2.22.1"),
        ("numpy", "2.5.0"),
        ("pandas", "3.0.3"),
        ("python-dateutil", "2.9.0.post0"),
        ("scikit-learn", "1.9.0"),
        ("scipy", "1.18.0"),
        ("six", "1.17.0"),
        ("threadpoolctl", "3.6.0"),
    ];

    #[test]
    fn python_runtime_sandbox_has_upstreams_libraries_hash_pinned() {
        let root = crate::workspace_root();
        let read = |path: &str| std::fs::read_to_string(root.join(path)).unwrap();
        let wanted: Vec<(String, String)> = UPSTREAM_V1_0_3_LIBRARIES
            .iter()
            .map(|(name, version)| ((*name).to_owned(), (*version).to_owned()))
            .collect();
        let mut listed = parse_pins(&read(PYTHON_RUNTIME_REQUIREMENTS_IN));
        listed.sort();
        assert_eq!(listed, wanted, "{PYTHON_RUNTIME_REQUIREMENTS_IN}");
        // The generated file pins exactly these (nothing dropped or added by the resolver),
        // each with its hashes.
        let generated = read(PYTHON_RUNTIME_REQUIREMENTS);
        let mut pinned = parse_pins(&generated);
        pinned.sort();
        assert_eq!(
            pinned, wanted,
            "{PYTHON_RUNTIME_REQUIREMENTS}: regenerate it"
        );
        let blocks: Vec<&str> = generated.split("==").skip(1).collect();
        assert_eq!(blocks.len(), wanted.len());
        for block in blocks {
            assert!(
                block.contains("--hash=sha256:"),
                "a pin without a hash: {block}"
            );
        }
    }

    #[test]
    fn python_runtime_sandbox_target_matches_upstreams_image() {
        let dockerfile =
            std::fs::read_to_string(crate::workspace_root().join("Dockerfile")).unwrap();
        let start = dockerfile
            .find(&format!(" AS {PYTHON_RUNTIME_SANDBOX}\n"))
            .expect("the Dockerfile has the python-runtime-sandbox target");
        let from = dockerfile[..start].rfind("FROM ").unwrap();
        let target = &dockerfile[from..];
        let target = &target[..target[5..]
            .find("\nFROM ")
            .map_or(target.len(), |end| end + 5)];
        for needed in [
            "FROM docker.io/library/python:3.14-slim AS python-runtime-sandbox",
            "apt-get install -y --no-install-recommends libgomp1",
            &format!("COPY {PYTHON_RUNTIME_REQUIREMENTS} "),
            "pip install --no-cache-dir --require-hashes -r ",
            "COPY --from=build /out/sandbox-runtime /usr/local/bin/sandbox-runtime",
            "SANDBOX_LISTEN=0.0.0.0:8888",
            "SANDBOX_BASE_DIR=/app",
            "USER 1000:1000",
            "WORKDIR /app",
            "EXPOSE 8888",
            "ENTRYPOINT [\"/usr/local/bin/sandbox-runtime\"]",
        ] {
            assert!(target.contains(needed), "missing {needed:?} in:\n{target}");
        }
    }

    #[test]
    fn pins_are_parsed_from_requirements_text() {
        let text =
            "# comment\nnumpy==2.5.0 \\\n    --hash=sha256:00\nScikit-Learn==1.9.0  # why\n\n";
        assert_eq!(
            parse_pins(text),
            [
                ("numpy".to_owned(), "2.5.0".to_owned()),
                ("scikit-learn".to_owned(), "1.9.0".to_owned())
            ]
        );
    }
}
