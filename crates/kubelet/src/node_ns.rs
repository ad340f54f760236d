//! The node's network for a kubelet that is not root: a user namespace and a network namespace
//! of the kubelet's own, where it is root (as `unshare --user --map-root-user --net` would make
//! them), holding the pods' bridge and, below it, each pod's namespace. The host's network
//! stays untouched: the kubelet process itself keeps running in it.
//!
//! A helper process (forked from the kubelet, making nothing but system calls) lives in the two
//! namespaces and, asked over a socket pair, makes what must be made inside them: TCP sockets
//! (a socket belongs to the namespace it was made in, so the kubelet's probes and
//! port-forwards, the API forward's listener and an in-process router connect through them)
//! and pods' network namespaces. Tools (`ip`, `nft`) and pods' processes enter the namespaces
//! with `setns`, allowed because the kubelet's user owns them. `slirp4netns` gives the node
//! namespace the host's network as a user-mode stack for pods' traffic to the internet,
//! without the host's loopback (`--disable-host-loopback`).
//!
//! The helper ends when the kubelet closes its end of the socket pair (also when the kubelet
//! dies), and with it the namespaces once nothing else holds them; `slirp4netns` ends when
//! the write end of its exit pipe, the kubelet's, closes.

use std::io;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

/// The name of the interface `slirp4netns` adds in the node namespace.
const UPLINK: &str = "tap0";
/// How long `slirp4netns` gets to say it is ready.
const SLIRP_READY: Duration = Duration::from_secs(10);

/// Requests to the helper (one byte each; `MAKE_SOCKET_IN` passes a network namespace).
const MAKE_SOCKET: u8 = b's';
const MAKE_NAMESPACE: u8 = b'n';
const MAKE_SOCKET_IN: u8 = b'i';

/// The helper's steps, named in its start-up error.
const STEPS: [&str; 7] = [
    "",
    "making a user namespace",
    "denying setgroups in it",
    "writing its gid map",
    "writing its uid map",
    "making a network namespace",
    "bringing up its loopback interface",
];

/// The node namespace of this process's kubelets (one, shared, so that pods of several
/// kubelets in one process reach each other).
static SHARED: Mutex<Weak<NodeNamespace>> = Mutex::new(Weak::new());

/// The helper and the namespaces it holds.
#[derive(Debug)]
pub(crate) struct NodeNamespace {
    pid: i32,
    /// The kubelet's end of the socket pair; one request and its answer at a time.
    control: Mutex<Option<OwnedFd>>,
    user: OwnedFd,
    net: OwnedFd,
    /// Why pods have no internet (`None`: `slirp4netns` gives them the host's network).
    pub(crate) internet: Option<String>,
    slirp: Mutex<Option<std::process::Child>>,
    /// Closing it ends `slirp4netns`.
    _slirp_exit: Option<OwnedFd>,
}

impl NodeNamespace {
    /// The node namespace this process's kubelets share, made by the first.
    pub(crate) fn shared() -> Result<Arc<Self>, String> {
        let mut shared = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(node) = shared.upgrade() {
            return Ok(node);
        }
        let node = Arc::new(Self::create()?);
        *shared = Arc::downgrade(&node);
        Ok(node)
    }

    /// Whether a node namespace can be made here (a helper is forked and ended at once); the
    /// error says why not.
    pub(crate) fn possible() -> Result<(), String> {
        let (pid, control) = fork_helper()?;
        drop(control);
        reap(pid);
        Ok(())
    }

    fn create() -> Result<Self, String> {
        let (pid, control) = fork_helper()?;
        let open = |kind: &str| {
            std::fs::File::open(format!("/proc/{pid}/ns/{kind}"))
                .map(OwnedFd::from)
                .map_err(|error| format!("cannot open the node's {kind} namespace: {error}"))
        };
        let (user, net) = match (open("user"), open("net")) {
            (Ok(user), Ok(net)) => (user, net),
            (Err(error), _) | (_, Err(error)) => {
                drop(control);
                reap(pid);
                return Err(error);
            }
        };
        let mut node = Self {
            pid,
            control: Mutex::new(Some(control)),
            user,
            net,
            internet: None,
            slirp: Mutex::new(None),
            _slirp_exit: None,
        };
        match node.start_slirp() {
            Ok((child, exit)) => {
                *node.slirp.get_mut().unwrap_or_else(PoisonError::into_inner) = Some(child);
                node._slirp_exit = Some(exit);
            }
            Err(why) => node.internet = Some(why),
        }
        Ok(node)
    }

    /// The user namespace (which tools and pods' processes enter first).
    pub(crate) fn user_fd(&self) -> RawFd {
        self.user.as_raw_fd()
    }

    /// The node's network namespace.
    pub(crate) fn net_fd(&self) -> RawFd {
        self.net.as_raw_fd()
    }

    /// A new IPv4 TCP socket in the node's network namespace (close-on-exec, blocking).
    pub(crate) fn socket(&self) -> io::Result<OwnedFd> {
        self.ask(MAKE_SOCKET)
    }

    /// A new network namespace (owned by the node's user namespace, its loopback up), held by
    /// the descriptor.
    pub(crate) fn new_namespace(&self) -> io::Result<OwnedFd> {
        self.ask(MAKE_NAMESPACE)
    }

    /// A new IPv4 TCP socket (non-blocking) in the network namespace `net`, one of
    /// [`NodeNamespace::new_namespace`]'s.
    pub(crate) fn tcp_socket_in(&self, net: RawFd) -> io::Result<tokio::net::TcpSocket> {
        let stream = std::net::TcpStream::from(self.ask_with(MAKE_SOCKET_IN, Some(net))?);
        stream.set_nonblocking(true)?;
        Ok(tokio::net::TcpSocket::from_std_stream(stream))
    }

    /// A listener on `addr` in the node's network namespace.
    pub(crate) fn listen(&self, addr: std::net::SocketAddrV4) -> io::Result<std::net::TcpListener> {
        let fd = self.socket()?;
        let address = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: addr.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*addr.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: `fd` is an open socket of ours; `address` outlives the call.
        #[allow(unsafe_code)]
        unsafe {
            if libc::bind(
                fd.as_raw_fd(),
                (&raw const address).cast(),
                std::mem::size_of_val(&address) as libc::socklen_t,
            ) != 0
                || libc::listen(fd.as_raw_fd(), 128) != 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(std::net::TcpListener::from(fd))
    }

    /// A socket in the node's network namespace, for a connection to a pod.
    pub(crate) fn tcp_socket(&self) -> io::Result<tokio::net::TcpSocket> {
        let stream = std::net::TcpStream::from(self.socket()?);
        stream.set_nonblocking(true)?;
        Ok(tokio::net::TcpSocket::from_std_stream(stream))
    }

    fn ask(&self, request: u8) -> io::Result<OwnedFd> {
        self.ask_with(request, None)
    }

    /// Sends `request` (passing `passed` along) and returns the descriptor answered.
    fn ask_with(&self, request: u8, passed: Option<RawFd>) -> io::Result<OwnedFd> {
        let control = self.control.lock().unwrap_or_else(PoisonError::into_inner);
        let fd = control
            .as_ref()
            .ok_or_else(|| helper_gone(io::Error::other("stopped")))?
            .as_raw_fd();
        // SAFETY: `fd` is the open socket pair end held under the lock; the buffers outlive
        // the calls.
        #[allow(unsafe_code)]
        unsafe {
            if !send(fd, request, passed) {
                return Err(helper_gone(io::Error::last_os_error()));
            }
            let (status, errno, passed) = receive(fd)?;
            match (status, passed) {
                (0, Some(passed)) => Ok(passed),
                _ => Err(io::Error::from_raw_os_error(errno)),
            }
        }
    }

    /// Starts `slirp4netns` for the node namespace and waits until it is ready; the error says
    /// why pods have no internet.
    fn start_slirp(&self) -> Result<(std::process::Child, OwnedFd), String> {
        let no = |why: String| format!("no internet for pods ({why})");
        if let Err(error) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/net/tun")
        {
            return Err(no(format!(
                "slirp4netns needs /dev/net/tun, which this user cannot open: {error}; most \
                 distributions let every user open it: chmod 0666 /dev/net/tun"
            )));
        }
        let (exit_read, exit_write) = pipe().map_err(|error| no(format!("a pipe: {error}")))?;
        let (ready_read, ready_write) = pipe().map_err(|error| no(format!("a pipe: {error}")))?;
        let mut command = Command::new("slirp4netns");
        command
            .args([
                "--configure",
                "--mtu=65520",
                "--disable-host-loopback",
                &format!("--exit-fd={}", exit_read.as_raw_fd()),
                &format!("--ready-fd={}", ready_write.as_raw_fd()),
                &self.pid.to_string(),
                UPLINK,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        crate::process::inherit(
            &mut command,
            vec![exit_read.as_raw_fd(), ready_write.as_raw_fd()],
        );
        let mut child = command.spawn().map_err(|error| {
            no(format!(
                "cannot run slirp4netns: {error}; apt-get install slirp4netns"
            ))
        })?;
        drop((exit_read, ready_write));
        let ready = wait_readable(&ready_read, SLIRP_READY);
        let mut byte = [0u8; 1];
        let said = ready
            && std::io::Read::read(&mut std::fs::File::from(ready_read), &mut byte)
                .is_ok_and(|n| n == 1);
        if said {
            return Ok((child, exit_write));
        }
        let _ = child.kill();
        let output = child.wait_with_output().ok();
        let stderr = output
            .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_owned())
            .unwrap_or_default();
        Err(no(format!("slirp4netns did not start: {stderr}")))
    }
}

impl Drop for NodeNamespace {
    fn drop(&mut self) {
        if let Some(mut slirp) = self
            .slirp
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = slirp.kill();
            let _ = slirp.wait();
        }
        // Closing the control socket ends the helper; then it is reaped.
        drop(
            self.control
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        reap(self.pid);
    }
}

/// A pipe (read end, write end), both close-on-exec.
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` outlives the call; on success both descriptors are ours.
    #[allow(unsafe_code)]
    unsafe {
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])))
    }
}

fn helper_gone(error: io::Error) -> io::Error {
    io::Error::new(
        error.kind(),
        format!("the node namespace's helper is gone: {error}"),
    )
}

/// Waits for the helper `pid` to exit (it does once its control socket is closed).
fn reap(pid: i32) {
    let mut status = 0;
    // SAFETY: waiting for a child of ours; `status` outlives the call.
    #[allow(unsafe_code)]
    unsafe {
        libc::waitpid(pid, &raw mut status, 0);
    }
}

/// Whether `fd` becomes readable (or hung up) within `timeout`.
fn wait_readable(fd: &OwnedFd, timeout: Duration) -> bool {
    let mut poll = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let millis = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one pollfd that outlives the call.
    #[allow(unsafe_code)]
    let ready = unsafe { libc::poll(&raw mut poll, 1, millis) };
    ready == 1
}

/// Receives one answer of the helper: status, errno and the descriptor passed, if any.
#[allow(unsafe_code)]
unsafe fn receive(fd: RawFd) -> io::Result<(u8, i32, Option<OwnedFd>)> {
    let mut data = [0u8; 5];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    let mut space = [0u64; 8];
    // SAFETY: a zeroed msghdr is valid; the pointers set below outlive the call.
    let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
    message.msg_iov = &raw mut iov;
    message.msg_iovlen = 1;
    message.msg_control = space.as_mut_ptr().cast();
    message.msg_controllen = std::mem::size_of_val(&space) as _;
    // SAFETY: as above.
    let received = unsafe { libc::recvmsg(fd, &raw mut message, libc::MSG_CMSG_CLOEXEC) };
    if received <= 0 {
        let error = if received == 0 {
            io::Error::new(io::ErrorKind::UnexpectedEof, "it closed its socket")
        } else {
            io::Error::last_os_error()
        };
        return Err(helper_gone(error));
    }
    let mut passed = None;
    // SAFETY: walking the control messages the kernel wrote into `space`.
    unsafe {
        let mut header = libc::CMSG_FIRSTHDR(&raw const message);
        while !header.is_null() {
            if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                let raw: RawFd = std::ptr::read_unaligned(libc::CMSG_DATA(header).cast());
                passed = Some(OwnedFd::from_raw_fd(raw));
            }
            header = libc::CMSG_NXTHDR(&raw const message, header);
        }
    }
    let errno = i32::from_ne_bytes([data[1], data[2], data[3], data[4]]);
    Ok((data[0], errno, passed))
}

/// Forks the helper; returns its pid and the kubelet's end of the socket pair once the helper
/// is in its namespaces, or why it could not get there.
#[allow(unsafe_code)]
fn fork_helper() -> Result<(i32, OwnedFd), String> {
    let uid = rustix::process::geteuid().as_raw();
    let gid = rustix::process::getegid().as_raw();
    // Everything the child needs is made before the fork: it must not allocate.
    let uid_map = format!("0 {uid} 1\n").into_bytes();
    let gid_map = format!("0 {gid} 1\n").into_bytes();
    let mut pair = [0; 2];
    // SAFETY: `pair` outlives the call; on success both descriptors are ours.
    let (ours, theirs) = unsafe {
        if libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            pair.as_mut_ptr(),
        ) != 0
        {
            return Err(format!(
                "a socket pair for the node namespace's helper: {}",
                io::Error::last_os_error()
            ));
        }
        (OwnedFd::from_raw_fd(pair[0]), OwnedFd::from_raw_fd(pair[1]))
    };
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|error| format!("opening /dev/null: {error}"))?;
    // SAFETY: the child runs only `helper`, which makes nothing but system calls on memory
    // prepared before the fork and never returns (it `_exit`s), as a child of a
    // multi-threaded process must.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!(
            "cannot fork the node namespace's helper: {}",
            io::Error::last_os_error()
        ));
    }
    if pid == 0 {
        // SAFETY: see above.
        unsafe { helper(theirs.as_raw_fd(), null.as_raw_fd(), &uid_map, &gid_map) }
    }
    drop((theirs, null));
    // SAFETY: `ours` is open; the helper answers once, at the end of its set-up.
    match unsafe { receive(ours.as_raw_fd()) } {
        Ok((0, _, _)) => Ok((pid, ours)),
        Ok((step, errno, _)) => {
            drop(ours);
            reap(pid);
            let step = STEPS
                .get(usize::from(step))
                .copied()
                .unwrap_or("setting up");
            Err(format!(
                "without root, {step} failed: {}{}",
                io::Error::from_raw_os_error(errno),
                if step == STEPS[1] {
                    format!(" ({})", crate::sandbox::spec::USERNS_DISABLED_HINT)
                } else {
                    String::new()
                }
            ))
        }
        Err(error) => {
            drop(ours);
            reap(pid);
            Err(format!("without root: {error}"))
        }
    }
}

/// The helper's end of the socket pair, in the helper.
const CONTROL: RawFd = 3;

/// The helper, in the forked child: system calls only, no allocation, never returns.
#[allow(unsafe_code)]
unsafe fn helper(control: RawFd, null: RawFd, uid_map: &[u8], gid_map: &[u8]) -> ! {
    // SAFETY (whole function): raw system calls on descriptors this process holds and on
    // buffers that live on its stack or were made before the fork.
    unsafe {
        // Out of the way of 0–3 first (either may be one of them).
        let control = libc::fcntl(control, libc::F_DUPFD, 10);
        let null = libc::fcntl(null, libc::F_DUPFD, 10);
        if control < 0 || null < 0 {
            libc::_exit(1);
        }
        for target in 0..3 {
            libc::dup2(null, target);
        }
        libc::dup2(control, CONTROL);
        // Nothing else of the kubelet's stays open here (its listeners, pipes, pods' files).
        libc::syscall(libc::SYS_close_range, CONTROL + 1, u32::MAX, 0);
        unsafe fn fail(step: u8) -> ! {
            // SAFETY: as in `helper`.
            unsafe {
                answer(CONTROL, step, *libc::__errno_location(), None);
                libc::_exit(1)
            }
        }
        if libc::unshare(libc::CLONE_NEWUSER) != 0 {
            fail(1);
        }
        if !write_file(c"/proc/self/setgroups", b"deny") {
            fail(2);
        }
        if !write_file(c"/proc/self/gid_map", gid_map) {
            fail(3);
        }
        if !write_file(c"/proc/self/uid_map", uid_map) {
            fail(4);
        }
        if libc::unshare(libc::CLONE_NEWNET) != 0 {
            fail(5);
        }
        let node = libc::open(
            c"/proc/self/ns/net".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if node < 0 {
            fail(5);
        }
        if !crate::pod_net::loopback_up() {
            fail(6);
        }
        answer(CONTROL, 0, 0, None);
        loop {
            let mut request = 0u8;
            let mut passed: RawFd = -1;
            let received = receive_request(CONTROL, &mut request, &mut passed);
            if received == 0 {
                libc::_exit(0);
            }
            if received < 0 {
                if *libc::__errno_location() == libc::EINTR {
                    continue;
                }
                libc::_exit(1);
            }
            let made = match request {
                MAKE_SOCKET => {
                    libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0)
                }
                MAKE_SOCKET_IN if passed >= 0 => {
                    if libc::setns(passed, libc::CLONE_NEWNET) != 0 {
                        -1
                    } else {
                        let made =
                            libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
                        let errno = *libc::__errno_location();
                        if libc::setns(node, libc::CLONE_NEWNET) != 0 {
                            libc::_exit(1);
                        }
                        *libc::__errno_location() = errno;
                        made
                    }
                }
                MAKE_NAMESPACE => {
                    if libc::unshare(libc::CLONE_NEWNET) != 0 || !crate::pod_net::loopback_up() {
                        -1
                    } else {
                        let made = libc::open(
                            c"/proc/self/ns/net".as_ptr(),
                            libc::O_RDONLY | libc::O_CLOEXEC,
                        );
                        let errno = *libc::__errno_location();
                        // Back to the node's namespace for the next request.
                        if libc::setns(node, libc::CLONE_NEWNET) != 0 {
                            libc::_exit(1);
                        }
                        *libc::__errno_location() = errno;
                        made
                    }
                }
                _ => {
                    *libc::__errno_location() = libc::EINVAL;
                    -1
                }
            };
            if passed >= 0 {
                let errno = *libc::__errno_location();
                libc::close(passed);
                *libc::__errno_location() = errno;
            }
            if made < 0 {
                answer(CONTROL, 1, *libc::__errno_location(), None);
            } else {
                answer(CONTROL, 0, 0, Some(made));
                libc::close(made);
            }
        }
    }
}

/// Writes `data` to the file at `path` (in the helper: system calls only).
#[allow(unsafe_code)]
unsafe fn write_file(path: &std::ffi::CStr, data: &[u8]) -> bool {
    // SAFETY: the path is NUL-terminated and `data` outlives the call.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return false;
        }
        let written = libc::write(fd, data.as_ptr().cast(), data.len());
        let saved = *libc::__errno_location();
        libc::close(fd);
        *libc::__errno_location() = saved;
        usize::try_from(written).is_ok_and(|n| n == data.len())
    }
}

/// Sends request `request` (with the descriptor `passed`, if any) to the helper over `fd`;
/// whether it was sent.
#[allow(unsafe_code)]
unsafe fn send(fd: RawFd, request: u8, passed: Option<RawFd>) -> bool {
    let mut data = [request];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    let mut space = [0u64; 8];
    // SAFETY: a zeroed msghdr is valid; every pointer set outlives the call; the control
    // message fits in `space`.
    unsafe {
        let mut message: libc::msghdr = std::mem::zeroed();
        message.msg_iov = &raw mut iov;
        message.msg_iovlen = 1;
        if let Some(passed) = passed {
            message.msg_control = space.as_mut_ptr().cast();
            message.msg_controllen = libc::CMSG_SPACE(4) as _;
            let header = libc::CMSG_FIRSTHDR(&raw const message);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(4) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<RawFd>(), passed);
        }
        libc::sendmsg(fd, &raw const message, libc::MSG_NOSIGNAL) == 1
    }
}

/// Receives one request in the helper (system calls only): its byte into `request`, a passed
/// descriptor into `passed`; recvmsg's result.
#[allow(unsafe_code)]
unsafe fn receive_request(fd: RawFd, request: &mut u8, passed: &mut RawFd) -> isize {
    let mut iov = libc::iovec {
        iov_base: (request as *mut u8).cast(),
        iov_len: 1,
    };
    let mut space = [0u64; 8];
    // SAFETY: a zeroed msghdr is valid; the pointers set outlive the call; the control
    // messages read are the kernel's, within `space`.
    unsafe {
        let mut message: libc::msghdr = std::mem::zeroed();
        message.msg_iov = &raw mut iov;
        message.msg_iovlen = 1;
        message.msg_control = space.as_mut_ptr().cast();
        message.msg_controllen = std::mem::size_of_val(&space) as _;
        let received = libc::recvmsg(fd, &raw mut message, libc::MSG_CMSG_CLOEXEC);
        if received > 0 {
            let header = libc::CMSG_FIRSTHDR(&raw const message);
            if !header.is_null()
                && (*header).cmsg_level == libc::SOL_SOCKET
                && (*header).cmsg_type == libc::SCM_RIGHTS
            {
                *passed = std::ptr::read_unaligned(libc::CMSG_DATA(header).cast());
            }
        }
        received
    }
}

/// Sends one answer (status, errno, a descriptor to pass) over `fd` (in the helper: system
/// calls only).
#[allow(unsafe_code)]
unsafe fn answer(fd: RawFd, status: u8, errno: i32, passed: Option<RawFd>) {
    let errno = errno.to_ne_bytes();
    let mut data = [status, errno[0], errno[1], errno[2], errno[3]];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    let mut space = [0u64; 8];
    // SAFETY: a zeroed msghdr is valid; every pointer set outlives the call; the control
    // message fits in `space` (CMSG_SPACE of one descriptor is 24 bytes).
    unsafe {
        let mut message: libc::msghdr = std::mem::zeroed();
        message.msg_iov = &raw mut iov;
        message.msg_iovlen = 1;
        if let Some(passed) = passed {
            message.msg_control = space.as_mut_ptr().cast();
            message.msg_controllen = libc::CMSG_SPACE(4) as _;
            let header = libc::CMSG_FIRSTHDR(&raw const message);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(4) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<RawFd>(), passed);
        }
        libc::sendmsg(fd, &raw const message, libc::MSG_NOSIGNAL);
    }
}
