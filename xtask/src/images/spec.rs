//! What `cargo xtask images --oci` builds, in one table: for each image its binary, account,
//! ports, environment, working directory and the Debian package sets of its layers. The
//! `Dockerfile` describes the same images for Docker; a test parses its targets and fails when the
//! two disagree.

/// A user and group of the same number, written to `/etc/passwd` and `/etc/group`, with a home
/// directory it owns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Account {
    pub(crate) id: u32,
    pub(crate) name: &'static str,
    pub(crate) home: &'static str,
    pub(crate) shell: &'static str,
}

/// Packages installed together as one layer: the ones wanted, with their dependency closure
/// (resolved by `cargo xtask images --lock`, less [`EXCLUDED`] and what lower sets hold).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PackageSet {
    /// Names the set in the lock file and the layer's history.
    pub(crate) name: &'static str,
    pub(crate) wanted: &'static [&'static str],
    /// Symbolic links a maintainer script would make (`update-alternatives`), as (link, target).
    pub(crate) links: &'static [(&'static str, &'static str)],
}

/// One image.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OciImage {
    /// The `Dockerfile` target (and [`super::IMAGES`] entry) it matches.
    pub(crate) target: &'static str,
    /// The workspace binary, installed as `/usr/local/bin/<binary>` and run as the entrypoint.
    pub(crate) binary: &'static str,
    /// The user the container runs as (`USER id:id`).
    pub(crate) account: Account,
    /// `EXPOSE`d TCP ports.
    pub(crate) ports: &'static [u16],
    /// The target's own `ENV`.
    pub(crate) env: &'static [(&'static str, &'static str)],
    /// What the target's Docker base image sets and the target inherits (not in the
    /// `Dockerfile`).
    pub(crate) base_env: &'static [(&'static str, &'static str)],
    /// The target's `WORKDIR`, created owned by the account; `None`: the account's home, as
    /// distroless's `nonroot` images have it.
    pub(crate) workdir: Option<&'static str>,
    /// Its layers' package sets, lowest first.
    pub(crate) sets: &'static [PackageSet],
}

impl OciImage {
    pub(crate) fn entrypoint(&self) -> String {
        format!("/usr/local/bin/{}", self.binary)
    }

    pub(crate) fn working_dir(&self) -> &'static str {
        self.workdir.unwrap_or(self.account.home)
    }
}

/// Docker's default `PATH`, which the Docker base images set.
const PATH: (&str, &str) = (
    "PATH",
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
);

/// distroless's `nonroot` user.
const NONROOT: Account = Account {
    id: 65532,
    name: "nonroot",
    home: "/home/nonroot",
    shell: "/sbin/nologin",
};

/// The runtime's user, as the `Dockerfile`'s `useradd` makes it.
const SANDBOX: Account = Account {
    id: 1000,
    name: "sandbox",
    home: "/home/sandbox",
    shell: "/bin/sh",
};

/// What distroless's `cc` image holds: the C library and the GCC runtime our binaries link, CA
/// certificates, time zones and the files (`/etc/os-release`, `/etc/services`, ...) of a Debian
/// system.
pub(crate) const BASE: PackageSet = PackageSet {
    name: "base",
    wanted: &[
        "base-files",
        "netbase",
        "tzdata",
        "ca-certificates",
        "libc6",
        "libgcc-s1",
    ],
    links: &[],
};

/// The runtime's environment: Debian's Python 3.11 with its standard library (`python` too, as
/// the Python images have it), and the shell and tools commands sent to the runtime run with
/// (`/bin/sh -c`), as in the Python images.
pub(crate) const RUNTIME: PackageSet = PackageSet {
    name: "runtime",
    wanted: &[
        "python3",
        "python-is-python3",
        "dash",
        "bash",
        "coreutils",
        "findutils",
        "grep",
        "sed",
        "mawk",
        "tar",
        "gzip",
    ],
    links: &[
        ("/usr/bin/awk", "mawk"),
        ("/usr/bin/nawk", "mawk"),
        ("/usr/bin/which", "which.debianutils"),
    ],
};

/// Dependencies left out, with why: what only maintainer scripts and package management need.
pub(crate) const EXCLUDED: [(&str, &str); 6] = [
    ("dpkg", "no package manager in the images"),
    ("debconf", "maintainer-script configuration only"),
    ("debconf-2.0", "virtual package of debconf"),
    (
        "install-info",
        "updates the info directory, which the images leave out",
    ),
    (
        "openssl",
        "ca-certificates' script needs it; the bundle is made at build time",
    ),
    (
        "awk",
        "base-files' scripts need it; the runtime set has mawk",
    ),
];

/// The images, in build order.
pub(crate) const OCI_IMAGES: [OciImage; 3] = [
    OciImage {
        target: "controller",
        binary: "agent-sandbox-controller",
        account: NONROOT,
        ports: &[8080, 8081],
        env: &[],
        base_env: &[PATH, ("SSL_CERT_FILE", CA_BUNDLE)],
        workdir: None,
        sets: &[BASE],
    },
    OciImage {
        target: "router",
        binary: "sandbox-router",
        account: NONROOT,
        ports: &[8080],
        env: &[],
        base_env: &[PATH, ("SSL_CERT_FILE", CA_BUNDLE)],
        workdir: None,
        sets: &[BASE],
    },
    OciImage {
        target: "runtime",
        binary: "sandbox-runtime",
        account: SANDBOX,
        ports: &[8888],
        env: &[
            ("SANDBOX_LISTEN", "0.0.0.0:8888"),
            ("SANDBOX_BASE_DIR", "/app"),
            ("HOME", "/home/sandbox"),
        ],
        base_env: &[PATH, ("LANG", "C.UTF-8")],
        workdir: Some("/app"),
        sets: &[BASE, RUNTIME],
    },
];

/// The certificate bundle (generated at build time from the ca-certificates package).
pub(crate) const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The cargo packages whose release binaries the images hold.
pub(crate) const CARGO_PACKAGES: [&str; 3] = [
    "agent-sandbox-controller",
    "agent-sandbox-router",
    "agent-sandbox-runtime",
];

/// Every package set, each once, lowest first.
pub(crate) fn package_sets() -> Vec<PackageSet> {
    let mut sets: Vec<PackageSet> = Vec::new();
    for image in &OCI_IMAGES {
        for set in image.sets {
            if !sets.iter().any(|known| known.name == set.name) {
                sets.push(*set);
            }
        }
    }
    sets
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The instructions of one `Dockerfile` stage that the table mirrors.
    #[derive(Debug, Default, PartialEq)]
    struct Stage {
        user: Option<String>,
        expose: Vec<u16>,
        env: Vec<(String, String)>,
        workdir: Option<String>,
        entrypoint: Vec<String>,
        copies: Vec<String>,
    }

    /// Parses the stage `AS <target>` of a Dockerfile: continuation lines joined, comments
    /// dropped.
    fn stage(dockerfile: &str, target: &str) -> Stage {
        let joined = dockerfile
            .lines()
            .filter(|line| !line.trim_start().starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
            .replace("\\\n", " ");
        let mut current = None;
        let mut stage = Stage::default();
        for line in joined.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let (instruction, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
            let rest = rest.trim();
            if instruction == "FROM" {
                current = rest
                    .split_once(" AS ")
                    .map(|(_, name)| name.trim().to_owned());
                continue;
            }
            if current.as_deref() != Some(target) {
                continue;
            }
            match instruction {
                "USER" => stage.user = Some(rest.to_owned()),
                "EXPOSE" => stage
                    .expose
                    .extend(rest.split_whitespace().map(|p| p.parse::<u16>().unwrap())),
                "ENV" => stage.env.extend(rest.split_whitespace().map(|pair| {
                    let (key, value) = pair.split_once('=').unwrap();
                    (key.to_owned(), value.to_owned())
                })),
                "WORKDIR" => stage.workdir = Some(rest.to_owned()),
                "ENTRYPOINT" => stage.entrypoint = serde_json::from_str(rest).unwrap(),
                "COPY" => stage.copies.push(rest.to_owned()),
                _ => {}
            }
        }
        assert!(
            stage != Stage::default(),
            "no stage `AS {target}` in the Dockerfile"
        );
        stage
    }

    fn expected(image: &OciImage) -> Stage {
        let id = image.account.id;
        Stage {
            user: Some(format!("{id}:{id}")),
            expose: image.ports.to_vec(),
            env: image
                .env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            workdir: image.workdir.map(str::to_owned),
            entrypoint: vec![image.entrypoint()],
            copies: vec![format!(
                "--from=build /out/{} {}",
                image.binary,
                image.entrypoint()
            )],
        }
    }

    /// The Docker and the Docker-less images cannot drift: every `Dockerfile` target of the
    /// table has the table's user, ports, environment, working directory, entrypoint and binary.
    #[test]
    fn dockerfile_targets_match_the_table() {
        let dockerfile =
            std::fs::read_to_string(crate::workspace_root().join("Dockerfile")).unwrap();
        for image in &OCI_IMAGES {
            pretty_assertions::assert_eq!(
                stage(&dockerfile, image.target),
                expected(image),
                "Dockerfile target {}",
                image.target
            );
        }
    }

    #[test]
    fn the_stage_parser_reads_what_it_compares() {
        let dockerfile = "FROM x AS a\nUSER 1:1\nFROM y AS b\n# c\nENV A=1 \\\n    B=2\nUSER 2:2\nEXPOSE 80 81\nWORKDIR /w\nENTRYPOINT [\"/e\"]\n";
        assert_eq!(
            stage(dockerfile, "b"),
            Stage {
                user: Some("2:2".into()),
                expose: vec![80, 81],
                env: vec![("A".into(), "1".into()), ("B".into(), "2".into())],
                workdir: Some("/w".into()),
                entrypoint: vec!["/e".into()],
                copies: vec![],
            }
        );
    }

    #[test]
    fn every_image_is_a_known_target_whose_binary_is_built() {
        let root = crate::workspace_root();
        let manifests: String = CARGO_PACKAGES
            .iter()
            .map(|package| {
                let dir = package.trim_start_matches("agent-sandbox-");
                std::fs::read_to_string(root.join("crates").join(dir).join("Cargo.toml")).unwrap()
            })
            .collect();
        for image in &OCI_IMAGES {
            assert!(
                super::super::IMAGES
                    .iter()
                    .any(|known| known.target == image.target),
                "{}",
                image.target
            );
            assert!(
                manifests.contains(&format!("name = \"{}\"", image.binary)),
                "no package of {CARGO_PACKAGES:?} builds {}",
                image.binary
            );
        }
        let names: Vec<_> = package_sets().iter().map(|set| set.name).collect();
        assert_eq!(names, ["base", "runtime"]);
    }
}
