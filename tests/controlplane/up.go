package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

const (
	etcdReadyTimeout      = 60 * time.Second
	apiserverReadyTimeout = 120 * time.Second
	saReadyTimeout        = 60 * time.Second
	stopTimeout           = 20 * time.Second
	portAttempts          = 3
)

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "controlplane up: "+format+"\n", args...)
}

// readyInfo is what the ready file holds, for harnesses that want more than the kubeconfig path.
type readyInfo struct {
	Kubeconfig string `json:"kubeconfig"`
	Server     string `json:"server"`
	Etcd       string `json:"etcd"`
	PID        int    `json:"pid"`
	Logs       string `json:"logs"`
	// With --node: the Node's name and the containerd socket images are imported through (`ctr --address`).
	Node       string `json:"node,omitempty"`
	Containerd string `json:"containerd,omitempty"`
}

func runUp(args []string) int {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	dir := fs.String("dir", "", "working directory for certificates, etcd data, logs and the kubeconfig (required)")
	readyFile := fs.String("ready-file", "", "written (JSON) once the control plane serves requests; removed on stop")
	nodeName := fs.String("node", "", "also run a node of this name (root; one per machine): containerd, kubelet, kube-scheduler")
	var nodeImages []string
	fs.Func("node-image", "an OCI archive to import into the node's containerd before the kubelet starts "+
		"(repeatable; one must hold "+pauseImage+")", func(v string) error {
		abs, err := filepath.Abs(v)
		nodeImages = append(nodeImages, abs)
		return err
	})
	gvisorDir := fs.String("node-gvisor", "", "a directory holding runsc and containerd-shim-runsc-v1 (scripts/gvisor-build): "+
		"the node then also runs Pods of RuntimeClass "+gvisorRuntimeClass+" under gVisor")
	lockTimeout := fs.Duration("node-lock-timeout", 30*time.Minute, "how long to wait for another node on this machine to stop")
	lockFD := fs.Int("node-lock-fd", -1, "an inherited descriptor of "+nodeLockPath+" on which the caller holds the "+
		"node lock (it then checks the machine after `up` exits, still holding it)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dir == "" {
		logf("--dir is required")
		return 2
	}
	d, err := filepath.Abs(*dir)
	if err != nil {
		logf("%v", err)
		return 1
	}
	rf := *readyFile
	if rf != "" {
		if rf, err = filepath.Abs(rf); err != nil {
			logf("%v", err)
			return 1
		}
	}

	// Signals arriving during startup must also lead to an orderly stop, so subscribe before starting anything.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)

	cp := &controlPlane{dir: d, readyFile: rf}
	if *nodeName != "" {
		// Checked before anything starts: a node that cannot run leaves nothing half-started.
		if err := nodePreflight(); err != nil {
			logf("%v", err)
			return 1
		}
		if *gvisorDir != "" {
			if *gvisorDir, err = gvisorPreflight(*gvisorDir); err != nil {
				logf("%v", err)
				return 1
			}
		}
		lock, err := acquireNodeLock(*lockFD, *lockTimeout, sigs)
		if err != nil {
			if errors.Is(err, errStopped) {
				return 0
			}
			logf("%v", err)
			return 1
		}
		cp.node = &node{name: *nodeName, images: nodeImages, gvisor: *gvisorDir, cp: cp, lock: lock}
	}
	err = cp.start(sigs)
	if err == nil {
		err = cp.serve(sigs)
	}
	cp.stop()
	logf("stopped")
	if err != nil && !errors.Is(err, errStopped) {
		logf("%v (logs in %s)", err, cp.logDir())
		return 1
	}
	return 0
}

var errStopped = errors.New("stopped by signal")

type controlPlane struct {
	dir, readyFile string
	pki            *pki
	etcd           *embed.Etcd
	etcdURL        string
	apiserver      *child
	apiserverPort  int
	controllerMgr  *child
	node           *node
}

func (cp *controlPlane) logDir() string { return filepath.Join(cp.dir, "logs") }

func (cp *controlPlane) start(sigs <-chan os.Signal) error {
	if cp.readyFile != "" {
		_ = os.Remove(cp.readyFile)
	}
	// Every start is a fresh cluster: stale etcd data would carry objects and membership of another run.
	for _, sub := range []string{"etcd", "pki", "logs"} {
		if err := os.RemoveAll(filepath.Join(cp.dir, sub)); err != nil {
			return err
		}
	}
	_ = os.Remove(filepath.Join(cp.dir, "kubeconfig"))
	if err := os.MkdirAll(cp.logDir(), 0o755); err != nil {
		return err
	}
	var err error
	if cp.pki, err = writePKI(filepath.Join(cp.dir, "pki")); err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	if err := cp.startEtcd(sigs); err != nil {
		return err
	}
	if err := cp.startAPIServer(sigs); err != nil {
		return err
	}
	cmKubeconfig := filepath.Join(cp.dir, "pki", "controller-manager.kubeconfig")
	if err := cp.writeKubeconfig(cmKubeconfig); err != nil {
		return err
	}
	cp.controllerMgr, err = startChild("kube-controller-manager", filepath.Join(cp.logDir(), "kube-controller-manager.log"),
		"--kubeconfig="+cmKubeconfig,
		// Besides the three a bare API needs: the built-in view, edit and admin roles get their rules
		// (clusterrole-aggregation); and what Pods need: kube-root-ca.crt in every namespace (each Pod with a
		// service-account token mounts it), Deployments and ReplicaSets, the not-ready taint lifted from a new
		// Node, terminated Pods collected, PodDisruptionBudgets' status (evictions consult it).
		"--controllers=garbage-collector-controller,namespace-controller,serviceaccount-controller,"+
			"clusterrole-aggregation-controller,"+
			"root-ca-certificate-publisher-controller,deployment-controller,replicaset-controller,"+
			"node-lifecycle-controller,pod-garbage-collector-controller,disruption-controller",
		"--root-ca-file="+cp.pki.CACert,
		"--leader-elect=false",
		"--secure-port=0",
		"--use-service-account-credentials=false",
	)
	if err != nil {
		return err
	}
	// The default service account appears only once the controller-manager works, so waiting for it means a
	// test never races the controllers' startup (namespaces stuck in Terminating, pods without a service account).
	if err := cp.waitFor(sigs, saReadyTimeout, "default service account", []*child{cp.apiserver, cp.controllerMgr},
		func(c *http.Client) bool {
			return cp.get(c, "/api/v1/namespaces/default/serviceaccounts/default") == http.StatusOK
		}); err != nil {
		return err
	}
	if cp.node != nil {
		if err := cp.node.start(sigs); err != nil {
			return err
		}
	}
	kubeconfig := filepath.Join(cp.dir, "kubeconfig")
	if err := cp.writeKubeconfig(kubeconfig); err != nil {
		return err
	}
	if cp.readyFile != "" {
		ri := readyInfo{Kubeconfig: kubeconfig, Server: cp.server(), Etcd: cp.etcdURL, PID: os.Getpid(), Logs: cp.logDir()}
		if cp.node != nil {
			ri.Node, ri.Containerd = cp.node.name, containerdSocket()
		}
		info, _ := json.MarshalIndent(ri, "", "  ")
		if err := writeFileAtomic(cp.readyFile, append(info, '\n'), 0o644); err != nil {
			return err
		}
	}
	logf("ready: server %s, kubeconfig %s", cp.server(), kubeconfig)
	return nil
}

func (cp *controlPlane) startEtcd(sigs <-chan os.Signal) error {
	var lastErr error
	// Free ports are picked by binding and releasing them; another process may grab one in between, so retry.
	for attempt := 0; attempt < portAttempts; attempt++ {
		ports, err := freePorts(2)
		if err != nil {
			return err
		}
		clientURL := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[0])}
		peerURL := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[1])}
		cfg := embed.NewConfig()
		cfg.Name = "controlplane"
		cfg.Dir = filepath.Join(cp.dir, "etcd")
		// A test cluster's data is disposable; fsync is what makes etcd slow on shared CI disks.
		cfg.UnsafeNoFsync = true
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{clientURL}, []url.URL{clientURL}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peerURL}, []url.URL{peerURL}
		cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
		cfg.Logger = "zap"
		cfg.LogLevel = "warn"
		cfg.LogOutputs = []string{filepath.Join(cp.logDir(), "etcd.log")}
		// Left at zero, every request counts as slow and is logged; these are etcd's own flag defaults.
		cfg.WarningUnaryRequestDuration = embed.DefaultWarningUnaryRequestDuration
		cfg.WarningApplyDuration = embed.DefaultWarningApplyDuration
		_ = os.RemoveAll(cfg.Dir)
		e, err := embed.StartEtcd(cfg)
		if err != nil {
			lastErr = fmt.Errorf("etcd: %w", err)
			if isAddrInUse(err) {
				continue
			}
			return lastErr
		}
		select {
		case <-e.Server.ReadyNotify():
			cp.etcd, cp.etcdURL = e, clientURL.String()
			return nil
		case err := <-e.Err():
			e.Close()
			return fmt.Errorf("etcd: %w", err)
		case <-time.After(etcdReadyTimeout):
			e.Close()
			return fmt.Errorf("etcd: not ready after %s", etcdReadyTimeout)
		case <-sigs:
			e.Close()
			return errStopped
		}
	}
	return lastErr
}

func (cp *controlPlane) startAPIServer(sigs <-chan os.Signal) error {
	logPath := filepath.Join(cp.logDir(), "kube-apiserver.log")
	var lastErr error
	for attempt := 0; attempt < portAttempts; attempt++ {
		ports, err := freePorts(1)
		if err != nil {
			return err
		}
		cp.apiserverPort = ports[0]
		cp.apiserver, err = startChild("kube-apiserver", logPath,
			"--etcd-servers="+cp.etcdURL,
			"--bind-address=127.0.0.1",
			// Without it a host lacking a default route fails with "Unable to find suitable network address".
			"--advertise-address=127.0.0.1",
			fmt.Sprintf("--secure-port=%d", cp.apiserverPort),
			"--tls-cert-file="+cp.pki.ServingCert,
			"--tls-private-key-file="+cp.pki.ServingKey,
			"--cert-dir="+filepath.Join(cp.dir, "pki"),
			"--client-ca-file="+cp.pki.CACert,
			// Node: kubelets may touch only their own Node and what their Pods use (with NodeRestriction).
			"--authorization-mode=Node,RBAC",
			"--enable-admission-plugins=NodeRestriction",
			// exec, logs and port-forward go to the kubelet as this client, verifying the kubelet's certificate.
			"--kubelet-client-certificate="+cp.pki.KubeletClientCert,
			"--kubelet-client-key="+cp.pki.KubeletClientKey,
			"--kubelet-certificate-authority="+cp.pki.CACert,
			"--kubelet-preferred-address-types=InternalIP",
			fmt.Sprintf("--service-account-issuer=https://127.0.0.1:%d", cp.apiserverPort),
			"--service-account-key-file="+cp.pki.SAPub,
			"--service-account-signing-key-file="+cp.pki.SAKey,
			"--service-cluster-ip-range=10.0.0.0/24",
			// No kubelet or endpoints to reconcile: the `kubernetes` service endpoints would point nowhere anyway.
			"--endpoint-reconciler-type=none",
			"--allow-privileged=true",
			"--profiling=false",
		)
		if err != nil {
			return err
		}
		err = cp.waitFor(sigs, apiserverReadyTimeout, "kube-apiserver /readyz", []*child{cp.apiserver},
			func(c *http.Client) bool { return cp.get(c, "/readyz") == http.StatusOK })
		if err == nil {
			return nil
		}
		lastErr = err
		cp.apiserver.stop(stopTimeout)
		if errors.Is(err, errStopped) || !logMentions(logPath, "address already in use") {
			return err
		}
		_ = os.Rename(logPath, fmt.Sprintf("%s.%d", logPath, attempt))
	}
	return lastErr
}

func (cp *controlPlane) server() string { return fmt.Sprintf("https://127.0.0.1:%d", cp.apiserverPort) }

// waitFor polls cond until it holds, failing early when a watched component exits or a stop signal arrives.
func (cp *controlPlane) waitFor(sigs <-chan os.Signal, timeout time.Duration, what string, watched []*child,
	cond func(*http.Client) bool) error {
	client, err := cp.httpClient()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if cond(client) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not ready after %s", what, timeout)
		}
		for _, c := range watched {
			select {
			case <-c.done:
				return fmt.Errorf("%s exited before %s was ready: %v (log: %s)", c.name, what, c.err, c.log)
			default:
			}
		}
		select {
		case <-sigs:
			return errStopped
		case <-tick.C:
		}
	}
}

func (cp *controlPlane) httpClient() (*http.Client, error) {
	caPEM, err := os.ReadFile(cp.pki.CACert)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	cert, err := tls.LoadX509KeyPair(cp.pki.AdminCert, cp.pki.AdminKey)
	if err != nil {
		return nil, err
	}
	return &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12,
		}},
	}, nil
}

func (cp *controlPlane) get(c *http.Client, path string) int {
	resp, err := c.Get(cp.server() + path)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode
}

func (cp *controlPlane) writeKubeconfig(path string) error {
	return cp.writeKubeconfigFor(path, "durable-sandbox-admin", cp.pki.AdminCert, cp.pki.AdminKey)
}

// writeKubeconfigFor writes a kubeconfig for the client certificate certFile/keyFile of user.
func (cp *controlPlane) writeKubeconfigFor(path, user, certFile, keyFile string) error {
	b64 := func(p string) (string, error) {
		data, err := os.ReadFile(p)
		return base64.StdEncoding.EncodeToString(data), err
	}
	ca, err := b64(cp.pki.CACert)
	if err != nil {
		return err
	}
	cert, err := b64(certFile)
	if err != nil {
		return err
	}
	key, err := b64(keyFile)
	if err != nil {
		return err
	}
	// Credentials are embedded so the kubeconfig stays usable when copied elsewhere (e.g. into a test's tmp dir).
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: durable-sandbox
  cluster:
    server: %[1]s
    certificate-authority-data: %[5]s
users:
- name: %[2]s
  user:
    client-certificate-data: %[3]s
    client-key-data: %[4]s
contexts:
- name: durable-sandbox
  context:
    cluster: durable-sandbox
    user: %[2]s
    namespace: default
current-context: durable-sandbox
`, cp.server(), user, cert, key, ca)
	return writeFileAtomic(path, []byte(kc), 0o600)
}

// serve blocks until a stop signal, or until a component dies: a half-dead control plane must not look healthy.
func (cp *controlPlane) serve(sigs <-chan os.Signal) error {
	nodeDone := make(chan error, 1)
	if cp.node != nil {
		for _, c := range cp.node.children() {
			go func(c *child) {
				<-c.done
				nodeDone <- fmt.Errorf("%s exited: %v (log: %s)", c.name, c.err, c.log)
			}(c)
		}
	}
	select {
	case err := <-nodeDone:
		return err
	case <-sigs:
		return errStopped
	case <-cp.apiserver.done:
		return fmt.Errorf("kube-apiserver exited: %v", cp.apiserver.err)
	case <-cp.controllerMgr.done:
		return fmt.Errorf("kube-controller-manager exited: %v", cp.controllerMgr.err)
	case err := <-cp.etcd.Err():
		return fmt.Errorf("etcd: %v", err)
	}
}

// stop tears down in dependency order: the controller-manager needs the apiserver, which needs etcd.
func (cp *controlPlane) stop() {
	if cp.readyFile != "" {
		_ = os.Remove(cp.readyFile)
	}
	// The node first: its Pods are deleted through the API, which must still be up.
	if cp.node != nil {
		cp.node.stop()
	}
	if cp.controllerMgr != nil {
		cp.controllerMgr.stop(stopTimeout)
	}
	if cp.apiserver != nil {
		cp.apiserver.stop(stopTimeout)
	}
	if cp.etcd != nil {
		cp.etcd.Close()
	}
}

type child struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// startChild runs a component as this same binary with a subcommand. Start and Wait happen on one locked OS
// thread because Pdeathsig fires when the *thread* that forked the child exits, not the process.
func startChild(name, logPath string, args ...string) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return startProgram(name, logPath, exe, append([]string{name}, args...)...)
}

// startProgram runs program (a path, or a name looked up on PATH) as a child, as startChild does.
func startProgram(name, logPath, program string, args ...string) (*child, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	c := &child{name: name, log: logPath, done: make(chan struct{})}
	c.cmd = exec.Command(program, args...)
	c.cmd.Stdout, c.cmd.Stderr = logFile, logFile
	c.cmd.SysProcAttr = childSysProcAttr()
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Deliberately never unlocked: the thread then exits with this goroutine, after the child is gone.
		defer close(c.done)
		defer logFile.Close()
		if err := c.cmd.Start(); err != nil {
			started <- err
			c.err = err
			return
		}
		started <- nil
		c.err = c.cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return c, nil
}

func (c *child) stop(timeout time.Duration) {
	select {
	case <-c.done:
		return
	default:
	}
	// The process group: socat forks a child per connection, which would outlive it.
	_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(timeout):
		logf("%s did not stop within %s, killing it", c.name, timeout)
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		<-c.done
	}
}

func freePorts(n int) ([]int, error) {
	// All listeners stay open until every port is chosen, so the n ports are distinct.
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func isAddrInUse(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")
}

func logMentions(path, s string) bool {
	data, err := os.ReadFile(path)
	return err == nil && strings.Contains(string(data), s)
}
