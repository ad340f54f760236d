//! The seccomp filter of a pod's processes, in the spirit of the container runtimes'
//! `RuntimeDefault` profile: the system calls that administer the machine or escape a
//! container (mounting, namespaces, kernel modules, keyrings, BPF, the clock, reboot,
//! `io_uring`) fail with `EPERM`; `clone3` fails with `ENOSYS`, so that the C library falls back
//! to `clone`, whose flags a filter can see (namespace flags refused); every other call is
//! allowed. A process of another architecture's ABI (x32 on x86-64, a foreign `AUDIT_ARCH`) is
//! killed rather than let through unfiltered.
//!
//! [`program`] is the classic BPF program as `seccomp(SECCOMP_SET_MODE_FILTER)` takes it (an array of
//! `struct sock_filter` in native byte order), built here without libseccomp: a straight list
//! of comparisons, so every jump is short.

/// `struct sock_filter`: one classic BPF instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Instruction {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

const LD_W_ABS: u16 = 0x20;
const JEQ_K: u16 = 0x15;
const JGE_K: u16 = 0x35;
const JSET_K: u16 = 0x45;
const RET_K: u16 = 0x06;

const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_ALLOW: u32 = 0x7fff_0000;
const RET_ERRNO: u32 = 0x0005_0000;

/// Offsets in `struct seccomp_data`: `nr`, `arch`, then the arguments (the low half of the
/// first on a little-endian machine).
const NR: u32 = 0;
const ARCH: u32 = 4;
const ARG0_LOW: u32 = 16;

const EPERM: u32 = 1;
const ENOSYS: u32 = 38;

/// `clone` flags that make namespaces (`CLONE_NEWNS`, `NEWCGROUP`, `NEWUTS`, `NEWIPC`,
/// `NEWUSER`, `NEWPID`, `NEWNET`; `CLONE_NEWTIME` shares its bit with the exit signal there).
const CLONE_NAMESPACE_FLAGS: u32 = 0x7e02_0000;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7;

/// x32 system calls on x86-64 carry this bit.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// The refused system calls common to both architectures.
const DENIED: &[libc::c_long] = &[
    libc::SYS_acct,
    libc::SYS_add_key,
    libc::SYS_adjtimex,
    libc::SYS_bpf,
    libc::SYS_clock_adjtime,
    libc::SYS_clock_settime,
    libc::SYS_delete_module,
    libc::SYS_fanotify_init,
    libc::SYS_finit_module,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fsopen,
    libc::SYS_fspick,
    libc::SYS_init_module,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_io_uring_setup,
    libc::SYS_kexec_file_load,
    libc::SYS_kexec_load,
    libc::SYS_keyctl,
    libc::SYS_lookup_dcookie,
    libc::SYS_mount,
    libc::SYS_mount_setattr,
    libc::SYS_move_mount,
    libc::SYS_name_to_handle_at,
    libc::SYS_open_by_handle_at,
    libc::SYS_open_tree,
    libc::SYS_perf_event_open,
    libc::SYS_pivot_root,
    libc::SYS_quotactl,
    libc::SYS_reboot,
    libc::SYS_request_key,
    libc::SYS_setns,
    libc::SYS_settimeofday,
    libc::SYS_swapoff,
    libc::SYS_swapon,
    libc::SYS_syslog,
    libc::SYS_umount2,
    libc::SYS_unshare,
    libc::SYS_userfaultfd,
    libc::SYS_vhangup,
];

/// The refused system calls only x86-64 has.
#[cfg(target_arch = "x86_64")]
const DENIED_ARCH: &[libc::c_long] = &[
    libc::SYS_ioperm,
    libc::SYS_iopl,
    libc::SYS_nfsservctl,
    libc::SYS_uselib,
    libc::SYS__sysctl,
];
#[cfg(target_arch = "aarch64")]
const DENIED_ARCH: &[libc::c_long] = &[];

fn number(nr: libc::c_long) -> u32 {
    u32::try_from(nr).unwrap_or(u32::MAX)
}

/// The names of the refused system calls' numbers, for the docs and tests.
pub(crate) fn denied() -> impl Iterator<Item = u32> {
    DENIED.iter().chain(DENIED_ARCH).map(|nr| number(*nr))
}

fn instructions() -> Vec<Instruction> {
    let stmt = |code, k| Instruction {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code, k, jt, jf| Instruction { code, jt, jf, k };
    let mut program = vec![
        stmt(LD_W_ABS, ARCH),
        jump(JEQ_K, AUDIT_ARCH, 1, 0),
        stmt(RET_K, RET_KILL_PROCESS),
        stmt(LD_W_ABS, NR),
    ];
    #[cfg(target_arch = "x86_64")]
    program.extend([
        jump(JGE_K, X32_SYSCALL_BIT, 0, 1),
        stmt(RET_K, RET_KILL_PROCESS),
    ]);
    for nr in denied() {
        program.extend([jump(JEQ_K, nr, 0, 1), stmt(RET_K, RET_ERRNO | EPERM)]);
    }
    program.extend([
        jump(JEQ_K, number(libc::SYS_clone3), 0, 1),
        stmt(RET_K, RET_ERRNO | ENOSYS),
        // clone: refused with a namespace flag, allowed otherwise.
        jump(JEQ_K, number(libc::SYS_clone), 0, 3),
        stmt(LD_W_ABS, ARG0_LOW),
        jump(JSET_K, CLONE_NAMESPACE_FLAGS, 0, 1),
        stmt(RET_K, RET_ERRNO | EPERM),
        stmt(RET_K, RET_ALLOW),
    ]);
    program
}

/// The filter as the pod-sandbox helper installs it.
pub(crate) fn program() -> Vec<u8> {
    instructions()
        .into_iter()
        .flat_map(|i| {
            let mut bytes = [0u8; 8];
            bytes[..2].copy_from_slice(&i.code.to_ne_bytes());
            bytes[2] = i.jt;
            bytes[3] = i.jf;
            bytes[4..].copy_from_slice(&i.k.to_ne_bytes());
            bytes
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the program over `seccomp_data` as the kernel would (the instructions used here).
    fn run(arch: u32, nr: u32, arg0: u32) -> u32 {
        let program = instructions();
        let mut accumulator = 0u32;
        let mut pc = 0usize;
        loop {
            let i = program[pc];
            match i.code {
                LD_W_ABS => {
                    accumulator = match i.k {
                        ARCH => arch,
                        NR => nr,
                        ARG0_LOW => arg0,
                        other => panic!("load of offset {other}"),
                    };
                    pc += 1;
                }
                RET_K => return i.k,
                code => {
                    let taken = match code {
                        JEQ_K => accumulator == i.k,
                        JGE_K => accumulator >= i.k,
                        JSET_K => accumulator & i.k != 0,
                        other => panic!("opcode {other:#x}"),
                    };
                    pc += 1 + usize::from(if taken { i.jt } else { i.jf });
                }
            }
        }
    }

    #[test]
    fn denied_calls_fail_with_eperm_and_the_rest_pass() {
        let nr = |n: libc::c_long| u32::try_from(n).unwrap();
        assert_eq!(run(AUDIT_ARCH, nr(libc::SYS_mount), 0), RET_ERRNO | EPERM);
        assert_eq!(run(AUDIT_ARCH, nr(libc::SYS_unshare), 0), RET_ERRNO | EPERM);
        assert_eq!(run(AUDIT_ARCH, nr(libc::SYS_bpf), 0), RET_ERRNO | EPERM);
        assert_eq!(run(AUDIT_ARCH, nr(libc::SYS_clone3), 0), RET_ERRNO | ENOSYS);
        for allowed in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_execve,
            libc::SYS_openat,
            libc::SYS_connect,
        ] {
            assert_eq!(run(AUDIT_ARCH, nr(allowed), 0), RET_ALLOW, "{allowed}");
        }
        // fork-like clone (SIGCHLD) and thread creation pass; namespaces do not.
        assert_eq!(run(AUDIT_ARCH, nr(libc::SYS_clone), 17), RET_ALLOW);
        assert_eq!(run(AUDIT_ARCH, nr(libc::SYS_clone), 0x003d_0f00), RET_ALLOW);
        assert_eq!(
            run(AUDIT_ARCH, nr(libc::SYS_clone), 0x1000_0000 | 17),
            RET_ERRNO | EPERM
        );
        assert_eq!(
            run(AUDIT_ARCH, nr(libc::SYS_clone), 0x4000_0000),
            RET_ERRNO | EPERM
        );
        // Another ABI is killed.
        assert_eq!(run(0x4000_0003, nr(libc::SYS_read), 0), RET_KILL_PROCESS);
        #[cfg(target_arch = "x86_64")]
        assert_eq!(run(AUDIT_ARCH, 0x4000_0000, 0), RET_KILL_PROCESS);
    }

    #[test]
    fn the_program_is_whole_instructions_and_fits_the_kernel_limit() {
        let bytes = program();
        assert_eq!(bytes.len() % 8, 0);
        // BPF_MAXINSNS.
        assert!(bytes.len() / 8 <= 4096);
        assert!(denied().count() > 30);
    }
}
