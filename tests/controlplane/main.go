// Command controlplane is the end-to-end test harness of durable-sandbox: a real Kubernetes control plane
// (embedded etcd, kube-apiserver, kube-controller-manager) and, on request, a real node beside it (kubelet,
// kube-scheduler, with the host's containerd), all built from Kubernetes' own Go modules, because no container
// engine is available to run kind, k3d or minikube.
//
//	controlplane kube-apiserver [upstream flags]
//	controlplane kube-controller-manager [upstream flags]
//	controlplane kube-scheduler [upstream flags]
//	controlplane kubelet [upstream flags]
//	controlplane up --dir D --ready-file F [--node NAME --node-image ARCHIVE ...]
//	controlplane node-clean
//
// The components run as separate child processes of this same binary: upstream's commands own process-wide
// state (signal handling, logging configuration, feature gates, metrics registries) that cannot be set up twice.
package main

import (
	"context"
	"fmt"
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // same log formats as the upstream binaries
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // same client-go metrics as the upstream binaries
	_ "k8s.io/component-base/metrics/prometheus/version"  // same version metric as the upstream binaries
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanagerapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	schedulerapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubeletapp "k8s.io/kubernetes/cmd/kubelet/app"
)

const usage = `usage:
  controlplane kube-apiserver [flags]            upstream kube-apiserver
  controlplane kube-controller-manager [flags]   upstream kube-controller-manager
  controlplane kube-scheduler [flags]            upstream kube-scheduler
  controlplane kubelet [flags]                   upstream kubelet
  controlplane up --dir D --ready-file F         etcd + apiserver + controller-manager; D/kubeconfig once ready
      [--node NAME --node-image ARCHIVE ...]     and a node: containerd, kubelet, scheduler (root; see node.go)
      [--node-gvisor DIR]                        and RuntimeClass gvisor on it (runsc from scripts/gvisor-build)
  controlplane node-clean                        remove what a node left behind (processes, mounts, links,
                                                 cgroups, sysctls) after an up that was killed
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	switch os.Args[1] {
	case "kube-apiserver":
		cmd := apiserverapp.NewAPIServerCommand()
		cmd.SetArgs(os.Args[2:])
		os.Exit(cli.Run(cmd))
	case "kube-controller-manager":
		cmd := controllermanagerapp.NewControllerManagerCommand()
		cmd.SetArgs(os.Args[2:])
		os.Exit(cli.Run(cmd))
	case "kube-scheduler":
		cmd := schedulerapp.NewSchedulerCommand()
		cmd.SetArgs(os.Args[2:])
		os.Exit(cli.Run(cmd))
	case "kubelet":
		cmd := kubeletapp.NewKubeletCommand(context.Background())
		cmd.SetArgs(os.Args[2:])
		os.Exit(cli.Run(cmd))
	case "node-clean":
		os.Exit(runNodeClean(os.Args[2:]))
	case "up":
		os.Exit(runUp(os.Args[2:]))
	case "-h", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "unknown subcommand %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
}
