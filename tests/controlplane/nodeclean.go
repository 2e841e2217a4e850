//go:build linux

package main

// Removing what a node made on the machine, whether it stopped in order or was killed (SIGKILL leaves the
// containerd shims, the containers, their mounts and network namespaces, the bridges and cgroups behind: the
// kernel kills only `up`'s direct children). Run at every node start, at every stop, and by `node-clean`.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The host state a node changes, saved before it does (in nodeStateDir, so it outlives a killed `up`) and put
// back by cleanNode.
type hostState struct {
	Sysctls map[string]string `json:"sysctls"`
	// Directories made at fixed host paths whatever the configuration says (the shims' sockets in
	// /run/containerd/s, libcni's result cache, the kubelet's device-plugin socket and container-log links);
	// removed if they did not exist before.
	Created []string `json:"created"`
}

var hostStateFile = filepath.Join(nodeStateDir, "host-state.json")

// Fixed host paths a node's containerd and CNI write to.
var hostPathsTouched = []string{"/run/containerd", "/var/lib/cni", "/var/lib/kubelet", "/var/log/containers"}

// The programs a node runs; a process of one of them that refers to the node's paths is the node's.
var nodeExecutables = map[string]bool{
	"containerd": true, "containerd-shim-runc-v2": true, "runc": true, "ctr": true, "socat": true, "controlplane": true,
	// With --node-gvisor: gVisor's shim (the wrapper execs the .bin) and runsc's sandbox and gofer processes.
	"containerd-shim-runsc-v1.bin": true, "runsc": true,
}

func saveSysctls() error {
	st := hostState{Sysctls: map[string]string{}}
	for _, key := range nodeSysctls {
		data, err := os.ReadFile(filepath.Join("/proc/sys", key))
		if err != nil {
			return fmt.Errorf("read sysctl %s: %w", key, err)
		}
		st.Sysctls[key] = strings.TrimSpace(string(data))
	}
	for _, p := range hostPathsTouched {
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
			st.Created = append(st.Created, p)
		}
	}
	if err := os.MkdirAll(nodeStateDir, 0o711); err != nil {
		return err
	}
	data, _ := json.MarshalIndent(st, "", "  ")
	return writeFileAtomic(hostStateFile, data, 0o600)
}

// cleanNode removes every trace of a node and says what it removed. The caller holds the node lock.
func cleanNode() []string {
	var did []string
	for attempt := 0; attempt < 3; attempt++ {
		pids := nodeProcesses()
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		waitGone(pids, 10*time.Second)
		did = append(did, fmt.Sprintf("killed %d processes", len(pids)))
	}
	if n := unmountUnder(nodeRunDir, nodeStateDir); n > 0 {
		did = append(did, fmt.Sprintf("unmounted %d mounts", n))
	}
	for _, link := range nodeLinks() {
		if out, err := exec.Command("ip", "link", "delete", link).CombinedOutput(); err == nil {
			did = append(did, "deleted link "+link)
		} else {
			logf("node-clean: ip link delete %s: %v: %s", link, err, strings.TrimSpace(string(out)))
		}
	}
	if n := removeCgroups(); n > 0 {
		did = append(did, fmt.Sprintf("removed %d cgroups", n))
	}
	if data, err := os.ReadFile(hostStateFile); err == nil {
		var st hostState
		if json.Unmarshal(data, &st) == nil {
			for key, value := range st.Sysctls {
				if err := os.WriteFile(filepath.Join("/proc/sys", key), []byte(value+"\n"), 0o644); err != nil {
					logf("node-clean: restore sysctl %s=%s: %v", key, value, err)
				}
			}
			for _, p := range st.Created {
				if len(mountsUnder(p)) == 0 && os.RemoveAll(p) == nil {
					did = append(did, "removed "+p)
				}
			}
			did = append(did, "restored sysctls")
		}
		_ = os.Remove(hostStateFile)
	}
	for _, d := range []string{nodeRunDir, nodeStateDir} {
		if _, err := os.Stat(d); err != nil {
			continue
		}
		// Never recurse into something still mounted: RemoveAll would delete the mounted filesystem's files.
		if m := mountsUnder(d); len(m) > 0 {
			logf("node-clean: %s still has mounts (%s); left in place", d, strings.Join(m, ", "))
			continue
		}
		if err := os.RemoveAll(d); err != nil {
			logf("node-clean: remove %s: %v", d, err)
		} else {
			did = append(did, "removed "+d)
		}
	}
	return did
}

// nodeLeftovers lists what of a node is still on the machine (empty: nothing).
func nodeLeftovers() []string {
	var left []string
	if pids := nodeProcesses(); len(pids) > 0 {
		left = append(left, fmt.Sprintf("processes %v", pids))
	}
	if m := append(mountsUnder(nodeRunDir), mountsUnder(nodeStateDir)...); len(m) > 0 {
		left = append(left, "mounts "+strings.Join(m, ", "))
	}
	if links := nodeLinks(); len(links) > 0 {
		left = append(left, "links "+strings.Join(links, ", "))
	}
	for _, root := range cgroupMounts() {
		if _, err := os.Stat(filepath.Join(root, "kubepods")); err == nil {
			left = append(left, "cgroup "+filepath.Join(root, "kubepods"))
		}
	}
	for _, d := range []string{nodeRunDir, nodeStateDir} {
		if _, err := os.Stat(d); err == nil {
			left = append(left, "directory "+d)
		}
	}
	return left
}

// nodeProcesses: the node's programs that refer to its paths (shims outlive containerd; socat forks one child
// per connection), and every process in the kubepods cgroups (the containers).
func nodeProcesses() []int {
	self := os.Getpid()
	seen := map[int]bool{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self || !alive(pid) {
			continue
		}
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if err != nil || !nodeExecutables[filepath.Base(strings.TrimSuffix(exe, " (deleted)"))] {
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		c := string(cmdline)
		if strings.Contains(c, nodeRunDir) || strings.Contains(c, nodeStateDir) || strings.Contains(c, "bind="+serviceIP+",") {
			seen[pid] = true
		}
	}
	for _, root := range cgroupMounts() {
		_ = filepath.WalkDir(filepath.Join(root, "kubepods"), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			data, _ := os.ReadFile(path)
			for _, f := range strings.Fields(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil && pid != self && alive(pid) {
					seen[pid] = true
				}
			}
			return nil
		})
	}
	pids := make([]int, 0, len(seen))
	for pid := range seen {
		pids = append(pids, pid)
	}
	sort.Ints(pids)
	return pids
}

// alive: the process exists and is not a zombie (a killed stale process nobody reaps is gone for our purposes).
func alive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func waitGone(pids []int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		any := false
		for _, pid := range pids {
			if alive(pid) {
				any = true
				break
			}
		}
		if !any {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type mountInfo struct{ point, fstype string }

func readMounts() []mountInfo {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []mountInfo
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source superoptions
		fields := strings.Fields(sc.Text())
		if len(fields) < 7 {
			continue
		}
		fstype := ""
		for i, fld := range fields {
			if fld == "-" && i+1 < len(fields) {
				fstype = fields[i+1]
				break
			}
		}
		out = append(out, mountInfo{point: unescapeMount(fields[4]), fstype: fstype})
	}
	return out
}

// unescapeMount decodes mountinfo's octal escapes (\040 for a space, ...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func mountsUnder(dir string) []string {
	var out []string
	for _, m := range readMounts() {
		if m.point == dir || strings.HasPrefix(m.point, dir+"/") {
			out = append(out, m.point)
		}
	}
	return out
}

// unmountUnder detaches every mount below the directories, deepest first; returns how many it unmounted.
func unmountUnder(dirs ...string) int {
	count := 0
	for round := 0; round < 5; round++ {
		var points []string
		for _, d := range dirs {
			points = append(points, mountsUnder(d)...)
		}
		if len(points) == 0 {
			break
		}
		sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
		for _, p := range points {
			if err := syscall.Unmount(p, syscall.MNT_DETACH); err == nil {
				count++
			} else if round == 4 {
				logf("node-clean: unmount %s: %v", p, err)
			}
		}
	}
	return count
}

// nodeLinks: the Pod bridge's veths (their Pods' namespaces may be gone already), then the two bridges.
func nodeLinks() []string {
	var links []string
	if out, err := exec.Command("ip", "-o", "link", "show", "master", podBridge).Output(); err == nil {
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			// "7: veth1234@if2: <...>"
			if parts := strings.SplitN(line, ": ", 3); len(parts) >= 2 {
				links = append(links, strings.SplitN(parts[1], "@", 2)[0])
			}
		}
	}
	for _, b := range []string{podBridge, svcBridge} {
		if exec.Command("ip", "link", "show", "dev", b).Run() == nil {
			links = append(links, b)
		}
	}
	return links
}

func cgroupMounts() []string {
	var out []string
	for _, m := range readMounts() {
		if m.fstype == "cgroup" || m.fstype == "cgroup2" {
			out = append(out, m.point)
		}
	}
	return out
}

// removeCgroups removes the kubepods tree of every hierarchy, deepest first (a cgroup is removed with rmdir
// once it has no processes and no children); returns how many it removed.
func removeCgroups() int {
	count := 0
	for _, root := range cgroupMounts() {
		top := filepath.Join(root, "kubepods")
		deadline := time.Now().Add(10 * time.Second)
		for {
			var dirs []string
			_ = filepath.WalkDir(top, func(path string, d fs.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, path)
				}
				return nil
			})
			if len(dirs) == 0 {
				break
			}
			sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
			var lastErr error
			for _, d := range dirs {
				if err := syscall.Rmdir(d); err == nil {
					count++
				} else {
					lastErr = err
				}
			}
			if lastErr == nil {
				break
			}
			if time.Now().After(deadline) {
				logf("node-clean: cgroups under %s: %v", top, lastErr)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return count
}

// runNodeClean is `controlplane node-clean [--check]`: remove what a node left (after an `up` that was killed),
// or with --check only list it (exit 1 if anything is left). While a node runs, its state is its own: both
// leave it alone and say so.
func runNodeClean(args []string) int {
	check := len(args) > 0 && args[0] == "--check"
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "node-clean: must run as root")
		return 1
	}
	if err := os.MkdirAll(filepath.Dir(nodeLockPath), 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "node-clean:", err)
		return 1
	}
	f, err := os.OpenFile(nodeLockPath, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "node-clean:", err)
		return 1
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(nodeLockPath)
		fmt.Fprintf(os.Stderr, "node-clean: a node is running (pid %s holds %s); its state is left alone\n",
			strings.TrimSpace(string(holder)), nodeLockPath)
		return 0
	}
	if !check {
		for _, did := range cleanNode() {
			fmt.Fprintln(os.Stderr, "node-clean:", did)
		}
	}
	left := nodeLeftovers()
	for _, l := range left {
		fmt.Println(l)
	}
	if len(left) > 0 {
		return 1
	}
	return 0
}
