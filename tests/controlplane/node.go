package main

// A real node beside the control plane: the host's containerd (with runc and the CNI bridge plugin), a kubelet
// and a kube-scheduler from this binary, and a socat that makes the `kubernetes` Service reachable from Pods.
// Measured recipe and the errors met on the way: docs/testing.md ("The node").
//
// The node's state is machine-wide by nature (the kubelet's and containerd's directories, the bridges, the
// kubepods cgroups, 10.0.0.1, sysctls), so one node runs per machine: `up --node` holds nodeLockPath for as
// long as it runs, cleans whatever a killed predecessor left before it starts, and undoes everything it did
// when it stops (nodeclean.go). Everything lives under fixed paths of its own, never the host's defaults
// (/var/lib/containerd, /etc/cni, /var/lib/kubelet), so a host's own containerd is left alone.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

const (
	nodeStateDir = "/var/lib/durable-sandbox-node" // kubelet root, containerd root, CNI config and IPAM state
	nodeRunDir   = "/run/durable-sandbox-node"     // containerd state and socket, netns mounts
	nodeLockPath = "/run/lock/durable-sandbox-node.lock"

	// The node's address: the gateway of the Pod bridge, created before the kubelet so that it can serve there.
	// It is local to this machine (Pods have no default route), and the kubelet refuses a loopback node IP.
	podBridge  = "dsb-cni0"
	podSubnet  = "10.88.0.0/24"
	nodeIP     = "10.88.0.1" // podSubnet's gateway; the bridge holds nodeIP/24
	svcBridge  = "dsb-svc0"  // holds serviceIP alone: there is no kube-proxy, and dummy links are unavailable here
	serviceIP  = "10.0.0.1"  // the `kubernetes` Service: the first address of --service-cluster-ip-range
	serviceNet = "10.0.0.0/24"
	// Routed from Pods to the node for the egress tests (tests/e2e/test_sandbox_egress_node.py), which serve them on
	// a link of the host while they run: a link-local address, standing for cloud metadata's 169.254.169.254 (this
	// machine's own route to which leads off it), and a public one (TEST-NET-2). When no test serves them the host
	// routes them into svcBridge, which has no port: dropped there, never forwarded off the machine.
	egressProbeLinkLocal = "169.254.77.77"
	egressProbePublic    = "198.51.100.77"
	// The sandbox ("pause") image containerd starts for every Pod; it is never pulled: scripts/node-images
	// builds it and `up` imports it (--node-image).
	pauseImage = "localhost/pause:3.10"
	cniBinDir  = "/usr/lib/cni"

	// With --node-gvisor: the containerd runtime handler and the RuntimeClass that selects it.
	gvisorHandler      = "runsc"
	gvisorRuntimeClass = "gvisor"

	nodeReadyTimeout      = 120 * time.Second
	containerdWaitTimeout = 30 * time.Second
	podDrainTimeout       = 60 * time.Second
)

// The host programs a node needs, checked before anything starts so that a missing one is one clear error.
var nodePrograms = []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "socat", "ip"}
var cniPlugins = []string{"bridge", "host-local", "loopback"}

// The sysctls the kubelet (setupKernelTunables) and the bridge plugin (isGateway) change; restored on stop.
var nodeSysctls = []string{
	"net/ipv4/ip_forward", "vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

func containerdSocket() string { return filepath.Join(nodeRunDir, "containerd", "containerd.sock") }

type node struct {
	name   string
	images []string
	gvisor string // a directory with runsc and its containerd shim, or "" (no gVisor runtime)
	cp     *controlPlane
	lock   *os.File
	dir    string // per-run files: certificates, kubeconfigs and configuration (under the control plane's dir)

	containerd, socat, kubelet, scheduler *child
	started                               bool // anything machine-wide may have been touched: stop must clean
}

// nodePreflight names the first missing piece, before any process starts.
func nodePreflight() error {
	if runtime.GOOS != "linux" {
		return errors.New("node: needs Linux (cgroups, mounts, network namespaces)")
	}
	if os.Geteuid() != 0 {
		return errors.New("node: must run as root (containerd, the kubelet's cgroups and mounts, the bridges)")
	}
	for _, p := range nodePrograms {
		if _, err := exec.LookPath(p); err != nil {
			return fmt.Errorf("node: %s is not installed (not on PATH); scripts/node-prepare installs it", p)
		}
	}
	for _, p := range cniPlugins {
		if _, err := os.Stat(filepath.Join(cniBinDir, p)); err != nil {
			return fmt.Errorf("node: CNI plugin %s missing in %s; scripts/node-prepare installs it", p, cniBinDir)
		}
	}
	return nil
}

// gvisorPreflight checks a --node-gvisor directory and returns it absolute.
func gvisorPreflight(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for _, p := range []string{"runsc", "containerd-shim-runsc-v1"} {
		info, err := os.Stat(filepath.Join(abs, p))
		if err != nil || info.Mode()&0o111 == 0 {
			return "", fmt.Errorf("node: --node-gvisor %s has no executable %s; scripts/gvisor-build makes the directory", abs, p)
		}
	}
	return abs, nil
}

// acquireNodeLock takes the machine-wide node lock, waiting up to timeout for another node to stop; or, given
// an inherited descriptor on which the caller holds it, checks that it is held there.
func acquireNodeLock(fd int, timeout time.Duration, sigs <-chan os.Signal) (*os.File, error) {
	if fd >= 0 {
		f := os.NewFile(uintptr(fd), nodeLockPath)
		// The same open file description as the caller's: succeeds at once if, and only if, the caller holds it.
		if err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			return nil, fmt.Errorf("node: --node-lock-fd %d does not hold %s: %w", fd, nodeLockPath, err)
		}
		return f, nil
	}
	if err := os.MkdirAll(filepath.Dir(nodeLockPath), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(nodeLockPath, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(timeout)
	said := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			_ = f.Truncate(0)
			_, _ = f.WriteAt([]byte(fmt.Sprintf("%d\n", os.Getpid())), 0)
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("node lock %s: %w", nodeLockPath, err)
		}
		holder, _ := os.ReadFile(nodeLockPath)
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("node: another node runs on this machine (pid %s holds %s) and did not stop within %s",
				strings.TrimSpace(string(holder)), nodeLockPath, timeout)
		}
		if !said {
			logf("node: another node runs on this machine (pid %s holds %s); waiting up to %s for it to stop",
				strings.TrimSpace(string(holder)), nodeLockPath, timeout)
			said = true
		}
		select {
		case <-sigs:
			f.Close()
			return nil, errStopped
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (n *node) start(sigs <-chan os.Signal) error {
	n.dir = filepath.Join(n.cp.dir, "node")
	if err := os.MkdirAll(n.dir, 0o700); err != nil {
		return err
	}
	if removed := cleanNode(); len(removed) > 0 {
		logf("node: removed what an earlier node left behind: %s", strings.Join(removed, "; "))
	}
	n.started = true
	if err := saveSysctls(); err != nil {
		return err
	}
	if err := n.writeCredentials(); err != nil {
		return fmt.Errorf("node credentials: %w", err)
	}
	if err := n.setUpNetwork(); err != nil {
		return fmt.Errorf("node network: %w", err)
	}
	var err error
	n.socat, err = startProgram("socat", filepath.Join(n.cp.logDir(), "socat.log"), "socat",
		fmt.Sprintf("TCP-LISTEN:443,bind=%s,fork,reuseaddr", serviceIP), fmt.Sprintf("TCP:127.0.0.1:%d", n.cp.apiserverPort))
	if err != nil {
		return err
	}
	if err := n.startContainerd(sigs); err != nil {
		return err
	}
	if err := n.importImages(); err != nil {
		return err
	}
	logf("node: starting the kubelet and kube-scheduler")
	if n.kubelet, err = startChild("kubelet", filepath.Join(n.cp.logDir(), "kubelet.log"),
		"--config="+filepath.Join(n.dir, "kubelet.yaml"),
		"--kubeconfig="+filepath.Join(n.dir, "kubelet.kubeconfig"),
		"--hostname-override="+n.name,
		"--node-ip="+nodeIP,
		"--root-dir="+filepath.Join(nodeStateDir, "kubelet"),
	); err != nil {
		return err
	}
	if n.scheduler, err = startChild("kube-scheduler", filepath.Join(n.cp.logDir(), "kube-scheduler.log"),
		"--kubeconfig="+filepath.Join(n.dir, "scheduler.kubeconfig"),
		"--leader-elect=false",
		"--secure-port=0",
	); err != nil {
		return err
	}
	watched := []*child{n.cp.apiserver, n.cp.controllerMgr, n.containerd, n.socat, n.kubelet, n.scheduler}
	// Ready, and untainted: the node-lifecycle controller removes the not-ready taint admission puts on a new
	// Node; until then nothing schedules.
	if err := n.cp.waitFor(sigs, nodeReadyTimeout, "node "+n.name+" Ready", watched, func(c *http.Client) bool {
		var nd struct {
			Spec struct {
				Taints []struct{ Key string } `json:"taints"`
			} `json:"spec"`
			Status struct {
				Conditions []struct{ Type, Status string } `json:"conditions"`
			} `json:"status"`
		}
		if n.cp.getJSON(c, "/api/v1/nodes/"+n.name, &nd) != nil {
			return false
		}
		for _, t := range nd.Spec.Taints {
			if strings.HasPrefix(t.Key, "node.kubernetes.io/") {
				return false
			}
		}
		for _, cond := range nd.Status.Conditions {
			if cond.Type == "Ready" {
				return cond.Status == "True"
			}
		}
		return false
	}); err != nil {
		return err
	}
	if n.gvisor != "" {
		if err := n.createRuntimeClass(); err != nil {
			return err
		}
	}
	// Every Pod with a service-account token mounts kube-root-ca.crt: wait for its publisher too.
	return n.cp.waitFor(sigs, saReadyTimeout, "kube-root-ca.crt in namespace default", watched, func(c *http.Client) bool {
		return n.cp.get(c, "/api/v1/namespaces/default/configmaps/kube-root-ca.crt") == http.StatusOK
	})
}

// createRuntimeClass makes RuntimeClass gvisor, whose Pods containerd runs with runsc.
func (n *node) createRuntimeClass() error {
	client, err := n.cp.httpClient()
	if err != nil {
		return err
	}
	rc := map[string]any{
		"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
		"metadata": map[string]any{"name": gvisorRuntimeClass}, "handler": gvisorHandler,
	}
	status, body, err := n.cp.send(client, http.MethodPost, "/apis/node.k8s.io/v1/runtimeclasses", rc)
	if err != nil {
		return err
	}
	if status != http.StatusCreated && status != http.StatusConflict {
		return fmt.Errorf("RuntimeClass %s: HTTP %d: %s", gvisorRuntimeClass, status, body)
	}
	logf("node: RuntimeClass %s runs Pods under gVisor (runsc from %s)", gvisorRuntimeClass, n.gvisor)
	return nil
}

// children are the node's processes, for serve() to watch.
func (n *node) children() []*child {
	var out []*child
	for _, c := range []*child{n.containerd, n.socat, n.kubelet, n.scheduler} {
		if c != nil {
			out = append(out, c)
		}
	}
	return out
}

func (n *node) writeCredentials() error {
	p := n.cp.pki
	d := n.dir
	if err := p.issueClient("system:node:"+n.name, []string{"system:nodes"}, filepath.Join(d, "kubelet-client.crt"),
		filepath.Join(d, "kubelet-client.key")); err != nil {
		return err
	}
	// The apiserver verifies this certificate (--kubelet-certificate-authority) before exec, logs, port-forward.
	if err := p.issueServing("system:node:"+n.name, []string{n.name}, []net.IP{net.ParseIP(nodeIP)},
		filepath.Join(d, "kubelet-serving.crt"), filepath.Join(d, "kubelet-serving.key")); err != nil {
		return err
	}
	// system:kube-scheduler is the user the bootstrap policy binds the scheduler's roles to.
	if err := p.issueClient("system:kube-scheduler", nil, filepath.Join(d, "scheduler.crt"),
		filepath.Join(d, "scheduler.key")); err != nil {
		return err
	}
	if err := n.cp.writeKubeconfigFor(filepath.Join(d, "kubelet.kubeconfig"), "system:node:"+n.name,
		filepath.Join(d, "kubelet-client.crt"), filepath.Join(d, "kubelet-client.key")); err != nil {
		return err
	}
	if err := n.cp.writeKubeconfigFor(filepath.Join(d, "scheduler.kubeconfig"), "system:kube-scheduler",
		filepath.Join(d, "scheduler.crt"), filepath.Join(d, "scheduler.key")); err != nil {
		return err
	}
	// The kubelet asks the apiserver (SubjectAccessReview) whether the apiserver's own client may exec, read
	// logs, port-forward: the bootstrap role for that is system:kubelet-api-admin, bound as kubeadm binds it.
	binding := map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
		"metadata": map[string]any{"name": "durable-sandbox:apiserver-kubelet-client"},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:kubelet-api-admin"},
		"subjects": []any{map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": kubeletClientUser}},
	}
	client, err := n.cp.httpClient()
	if err != nil {
		return err
	}
	status, body, err := n.cp.send(client, http.MethodPost, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
	if err != nil {
		return err
	}
	if status != http.StatusCreated && status != http.StatusConflict {
		return fmt.Errorf("ClusterRoleBinding for %s: HTTP %d: %s", kubeletClientUser, status, body)
	}
	return n.writeConfigs()
}

func (n *node) writeConfigs() error {
	d := n.dir
	kubelet := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %[1]s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: %[2]s/kubelet-serving.crt
tlsPrivateKeyFile: %[2]s/kubelet-serving.key
# No anonymous kubelet API: client certificates of the cluster CA, bearer tokens by TokenReview, and every
# request authorized by a SubjectAccessReview.
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[3]s}
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://%[4]s
# containerd 1.6 does not answer the CRI RuntimeConfig call; the kubelet then uses this.
cgroupDriver: cgroupfs
# These machines have cgroup v1 (hybrid); the kubelet refuses it from 1.35 unless told.
failCgroupV1: false
failSwapOn: false
# Root here lacks CAP_SYS_RESOURCE: no negative OOM score for the kubelet.
oomScoreAdj: 0
# Imported images cannot be pulled again: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1%%", nodefs.available: "1%%", nodefs.inodesFree: "1%%", imagefs.available: "1%%"}
# The chains are hints for other components (kube-proxy); none runs here, and they would outlive the node.
makeIPTablesUtilChains: false
clusterDomain: cluster.local
# Under the node's own directory rather than the host's /var/log/pods and /usr/libexec/kubernetes.
podLogsDir: %[5]s/pod-logs
volumePluginDir: %[5]s/kubelet-plugins
`, nodeIP, d, n.cp.pki.CACert, containerdSocket(), nodeStateDir)
	if err := writeFileAtomic(filepath.Join(d, "kubelet.yaml"), []byte(kubelet), 0o644); err != nil {
		return err
	}
	cniDir := filepath.Join(nodeStateDir, "cni")
	conflist := map[string]any{
		"cniVersion": "1.0.0", "name": "durable-sandbox",
		"plugins": []any{map[string]any{
			"type": "bridge", "bridge": podBridge, "isGateway": true, "ipMasq": false, "hairpinMode": true,
			"ipam": map[string]any{
				"type":   "host-local",
				"ranges": [][]map[string]string{{{"subnet": podSubnet, "gateway": nodeIP}}},
				"routes": []map[string]string{ // the Service range and the egress tests' two addresses: no default route
					{"dst": serviceNet}, {"dst": egressProbeLinkLocal + "/32"}, {"dst": egressProbePublic + "/32"}},
				"dataDir": filepath.Join(cniDir, "ipam"),
			},
		}},
	}
	data, _ := json.MarshalIndent(conflist, "", "  ")
	if err := os.MkdirAll(filepath.Join(cniDir, "net.d"), 0o755); err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(cniDir, "net.d", "10-durable-sandbox.conflist"), data, 0o644); err != nil {
		return err
	}
	containerd := fmt.Sprintf(`version = 2
root = "%[1]s/containerd"
state = "%[2]s/containerd"
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "%[3]s"
[ttrpc]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "%[1]s/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "%[4]s"
  # Root here lacks CAP_SYS_RESOURCE: runc would fail with EACCES on the kubelet's negative oom_score_adj.
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
%[7]s  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "%[5]s"
    conf_dir = "%[6]s"
    max_conf_num = 1
`, nodeStateDir, nodeRunDir, containerdSocket(), pauseImage, cniBinDir, filepath.Join(cniDir, "net.d"), n.gvisorRuntime())
	if n.gvisor != "" {
		// systrap: KVM fails here although /dev/kvm exists, and ptrace is slower (../shared/reference/gvisor.md).
		runsc := fmt.Sprintf("binary_name = %q\nroot = %q\n[runsc_config]\n  platform = \"systrap\"\n",
			filepath.Join(n.gvisor, "runsc"), filepath.Join(nodeRunDir, "runsc"))
		if err := writeFileAtomic(filepath.Join(d, "runsc.toml"), []byte(runsc), 0o644); err != nil {
			return err
		}
	}
	return writeFileAtomic(filepath.Join(d, "containerd.toml"), []byte(containerd), 0o644)
}

// gvisorRuntime is the containerd runtime section for gVisor's shim (none without --node-gvisor).
func (n *node) gvisorRuntime() string {
	if n.gvisor == "" {
		return ""
	}
	return fmt.Sprintf(`    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.%[1]s]
      runtime_type = "io.containerd.runsc.v1"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.%[1]s.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = %[2]q
`, gvisorHandler, filepath.Join(n.dir, "runsc.toml"))
}

// setUpNetwork makes the Pod bridge (holding the node IP) and the Service bridge (holding 10.0.0.1).
func (n *node) setUpNetwork() error {
	for _, link := range []struct{ name, addr string }{{podBridge, nodeIP + "/24"}, {svcBridge, serviceIP + "/32"}} {
		for _, args := range [][]string{
			{"link", "add", link.name, "type", "bridge"},
			{"addr", "add", link.addr, "dev", link.name},
			{"link", "set", link.name, "up"},
		} {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
			}
		}
	}
	// Gone with svcBridge when the node stops. A test serving one of them adds it as a local address, which the
	// kernel's local table prefers to these.
	for _, dst := range []string{egressProbeLinkLocal, egressProbePublic} {
		args := []string{"route", "add", dst + "/32", "dev", svcBridge}
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
		}
	}
	return nil
}

func (n *node) startContainerd(sigs <-chan os.Signal) error {
	for _, d := range []string{filepath.Dir(containerdSocket()), filepath.Join(nodeStateDir, "containerd")} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return err
		}
	}
	logf("node: starting containerd")
	if n.gvisor != "" {
		// containerd finds a runtime's shim (containerd-shim-runsc-v1) on its PATH; the node's children inherit
		// this process's environment.
		if err := os.Setenv("PATH", n.gvisor+string(os.PathListSeparator)+os.Getenv("PATH")); err != nil {
			return err
		}
	}
	var err error
	n.containerd, err = startProgram("containerd", filepath.Join(n.cp.logDir(), "containerd.log"), "containerd",
		"--config", filepath.Join(n.dir, "containerd.toml"))
	if err != nil {
		return err
	}
	deadline := time.Now().Add(containerdWaitTimeout)
	for {
		if out, err := n.ctr("version"); err == nil && bytes.Contains(out, []byte("Server:")) {
			return nil
		}
		select {
		case <-n.containerd.done:
			return fmt.Errorf("containerd exited at start: %v (log: %s)", n.containerd.err, filepath.Join(n.cp.logDir(), "containerd.log"))
		case <-sigs:
			return errStopped
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("containerd: no answer on %s after %s (log: %s)", containerdSocket(), containerdWaitTimeout,
				filepath.Join(n.cp.logDir(), "containerd.log"))
		}
	}
}

func (n *node) ctr(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	return exec.CommandContext(ctx, "ctr", append([]string{"--address", containerdSocket(), "--namespace", "k8s.io"}, args...)...).CombinedOutput()
}

// importImages imports the OCI archives given with --node-image (nothing is ever pulled); one must hold the
// sandbox image.
func (n *node) importImages() error {
	for _, archive := range n.images {
		logf("node: importing %s", archive)
		if out, err := n.ctr("images", "import", archive); err != nil {
			return fmt.Errorf("ctr images import %s: %v: %s", archive, err, bytes.TrimSpace(out))
		}
	}
	out, err := n.ctr("images", "list", "--quiet")
	if err != nil {
		return fmt.Errorf("ctr images list: %v: %s", err, bytes.TrimSpace(out))
	}
	for _, name := range strings.Fields(string(out)) {
		if name == pauseImage {
			return nil
		}
	}
	return fmt.Errorf("node: the sandbox image %s is not among the imported images (--node-image; scripts/node-images builds it)", pauseImage)
}

// stop drains the node (its Pods deleted while the kubelet still runs, so that their containers, mounts and
// network are torn down by their owners), stops its processes and removes everything machine-wide it made.
func (n *node) stop() {
	if n.scheduler != nil {
		n.scheduler.stop(stopTimeout)
	}
	if n.kubelet != nil {
		select {
		case <-n.kubelet.done:
		default:
			n.drain()
		}
		n.kubelet.stop(stopTimeout)
	}
	for _, c := range []*child{n.containerd, n.socat} {
		if c != nil {
			c.stop(stopTimeout)
		}
	}
	if n.started {
		if left := cleanNode(); len(left) > 0 {
			logf("node: removed after stop: %s", strings.Join(left, "; "))
		}
		if problems := nodeLeftovers(); len(problems) > 0 {
			logf("node: still left after cleaning: %s", strings.Join(problems, "; "))
		}
	}
	if n.lock != nil {
		_ = n.lock.Close()
	}
}

// drain deletes the Pods bound to this node with a short grace period and waits for the kubelet to finish
// them; whatever is left at the deadline is cleaned by force afterwards.
func (n *node) drain() {
	client, err := n.cp.httpClient()
	if err != nil {
		return
	}
	list := func() []struct{ Namespace, Name string } {
		var pods struct {
			Items []struct {
				Metadata struct{ Namespace, Name string } `json:"metadata"`
			} `json:"items"`
		}
		q := url.Values{"fieldSelector": {"spec.nodeName=" + n.name}}
		if n.cp.getJSON(client, "/api/v1/pods?"+q.Encode(), &pods) != nil {
			return nil
		}
		out := make([]struct{ Namespace, Name string }, 0, len(pods.Items))
		for _, p := range pods.Items {
			out = append(out, struct{ Namespace, Name string }{p.Metadata.Namespace, p.Metadata.Name})
		}
		return out
	}
	pods := list()
	if len(pods) == 0 {
		return
	}
	logf("node: deleting %d Pods", len(pods))
	for _, p := range pods {
		_, _, _ = n.cp.send(client, http.MethodDelete, fmt.Sprintf("/api/v1/namespaces/%s/pods/%s", p.Namespace, p.Name),
			map[string]any{"gracePeriodSeconds": 2})
	}
	deadline := time.Now().Add(podDrainTimeout)
	for time.Now().Before(deadline) {
		if len(list()) == 0 {
			return
		}
		select {
		case <-n.kubelet.done:
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
	logf("node: Pods still present after %s; removing their processes by force", podDrainTimeout)
}

// --- small helpers on the control plane used by the node ---

func (cp *controlPlane) getJSON(c *http.Client, path string, into any) error {
	status, body, err := cp.send(c, http.MethodGet, path, nil)
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return fmt.Errorf("GET %s: HTTP %d", path, status)
	}
	return json.Unmarshal(body, into)
}

func (cp *controlPlane) send(c *http.Client, method, path string, body any) (int, []byte, error) {
	var reader io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		reader = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, cp.server()+path, reader)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, data, err
}
