//go:build !linux

package main

import "syscall"

// Pdeathsig is Linux-only: elsewhere a SIGKILLed `up` can leave its components running.
func childSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
