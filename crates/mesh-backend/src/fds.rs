//! This process's descriptors made close-on-exec before a child is started: the CUDA driver opens
//! its own (`/dev/nvidia*`) without it, and a child that inherits them holds this process's
//! contexts, with their kernels and memory, alive after this process has died.

use std::os::fd::BorrowedFd;

use rustix::io::FdFlags;

/// Marks every descriptor above stderr close-on-exec; returns how many were not. A descriptor a
/// child must keep is handed over explicitly (`mesh_mps::process::inherit_fd`, which clears the
/// flag in the child only).
pub fn close_on_exec_all() -> std::io::Result<usize> {
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .collect();
    let mut marked = 0;
    for fd in fds {
        // SAFETY: the borrow is used only for F_GETFD / F_SETFD, which touch no memory: a descriptor
        // gone by now (the directory's own) just fails, and one reused meanwhile is marked
        // close-on-exec, which only changes what a later exec keeps.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let Ok(flags) = rustix::io::fcntl_getfd(fd) else { continue };
        if !flags.contains(FdFlags::CLOEXEC) && rustix::io::fcntl_setfd(fd, flags | FdFlags::CLOEXEC).is_ok() {
            marked += 1;
        }
    }
    Ok(marked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_without_the_flag_gets_it() {
        let (r, _w) = std::io::pipe().unwrap();
        rustix::io::fcntl_setfd(&r, FdFlags::empty()).unwrap();
        assert!(close_on_exec_all().unwrap() >= 1);
        assert!(rustix::io::fcntl_getfd(&r).unwrap().contains(FdFlags::CLOEXEC));
    }
}
