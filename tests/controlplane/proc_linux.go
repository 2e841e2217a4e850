package main

import "syscall"

// childSysProcAttr makes the kernel kill a component when `up` dies, even by SIGKILL, so that no orphaned
// apiserver keeps ports and memory after a test run is aborted. A process group of its own keeps a terminal's
// Ctrl-C from reaching the components directly: `up` stops them in order.
func childSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
