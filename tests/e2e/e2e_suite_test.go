/*
This file is part of the kubevirt-qcow2 project

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.

Copyright The kubevirt-qcow2 Authors.
*/

// Package e2e_test drives the patched KubeVirt on the one-node cluster of
// hack/cluster.sh the way users do: VMs applied with kubectl, volumes added
// with virtctl, state read back through the API and, where only the node
// can tell, from the node's files. The suite starts the cluster and
// installs KubeVirt when none runs (and stops it afterwards), or reuses the
// one `make cluster` started. When a spec fails, what a maintainer would ask
// for lands in _out/e2e-artifacts/<spec>/: objects, events, descriptions,
// pod logs and the node's component logs.
package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

func TestE2E(t *testing.T) {
	framework.RunSuite(t, "KubeVirt e2e Suite on the local cluster")
}

var (
	clusterScript = filepath.Join(testenv.RepoRoot(), "hack", "cluster.sh")
	clusterDir    = clusterDirectory()
	kubeconfig    = filepath.Join(clusterDir, "kubeconfig")
	virtctlBin    = filepath.Join(testenv.KubeVirtOut(), "bin", "virtctl")
	artifactsDir  = filepath.Join(testenv.OutDir(), "e2e-artifacts")
	kubectlBin    string
)

// clusterDirectory is hack/cluster.sh's CLUSTER_DIR: a run beside another
// names a cluster of its own.
func clusterDirectory() string {
	if dir := os.Getenv("CLUSTER_DIR"); dir != "" {
		return dir
	}
	return filepath.Join(testenv.OutDir(), "cluster")
}

var _ = BeforeSuite(func(ctx SpecContext) {
	if os.Geteuid() != 0 {
		framework.Require(fmt.Errorf("needs root"), "the one-node cluster")
	}
	out, err := exec.CommandContext(ctx, filepath.Join(testenv.RepoRoot(), "hack", "kubernetes.sh"), "kubectl").Output()
	framework.Require(err, "kubectl (hack/kubernetes.sh)")
	kubectlBin = filepath.Join(strings.TrimSpace(string(out)), "kubectl")

	if exec.CommandContext(ctx, clusterScript, "status").Run() == nil && kubevirtAvailable(ctx) && runsPatchedOperator(ctx) {
		out, err := kubectl(ctx, "get", "nodes", "-o", "name")
		framework.Require(err, "the running cluster's nodes")
		GinkgoWriter.Println("reusing the running cluster")
		installed = cluster{patched, len(strings.Fields(out))}
	}
}, NodeTimeout(time.Minute))

// The KubeVirt the cluster runs, as the suite installed it.
type kubevirtInstall string

const (
	// patched: the patched KubeVirt, installed by hack/cluster.sh kubevirt.
	patched kubevirtInstall = "kubevirt"
	// stock: KubeVirt from the pristine tree (hack/cluster.sh
	// kubevirt-stock), whatever the upgrade specs did to it since.
	stock kubevirtInstall = "kubevirt-stock"
)

// upgradeLabel marks the specs that start from stock KubeVirt.
const upgradeLabel = "upgrade"

// veleroLabel marks the specs of a real Velero, run by make e2e-velero.
const veleroLabel = "velero"

// twoNodesLabel marks the specs that need a second node (live migration):
// they run on a cluster of two, the others on one, where every pod is on
// the node inNode enters.
const twoNodesLabel = "two-nodes"

// cluster is what the cluster runs: which KubeVirt, on how many nodes.
type cluster struct {
	kubevirt kubevirtInstall
	nodes    int
}

var (
	// installed is what the cluster runs; zero before the suite started one.
	installed cluster
	// startedCluster: the suite started the cluster, so it stops it.
	startedCluster bool
)

// requireCluster makes the cluster run want: unless it already does, fresh
// nodes (KubeVirt cannot be swapped in place without leftovers) with want's
// KubeVirt installed.
func requireCluster(ctx context.Context, want cluster) {
	if installed == want {
		return
	}
	start := time.Now()
	installed = cluster{}
	framework.Require(run(ctx, clusterScript, "down"), "stopping the cluster (hack/cluster.sh down)")
	startedCluster = true
	up := exec.CommandContext(ctx, clusterScript, "up")
	up.Env = append(os.Environ(), fmt.Sprintf("CLUSTER_NODES=%d", want.nodes))
	up.Stdout, up.Stderr = GinkgoWriter, GinkgoWriter
	framework.Require(up.Run(), fmt.Sprintf("a cluster of %d node(s) (CLUSTER_NODES=%d hack/cluster.sh up)", want.nodes, want.nodes))
	fmt.Printf("cluster of %d node(s) up in %s\n", want.nodes, time.Since(start).Round(time.Second))
	start = time.Now()
	framework.Require(run(ctx, clusterScript, string(want.kubevirt)), "KubeVirt on the cluster (hack/cluster.sh "+string(want.kubevirt)+")")
	fmt.Printf("%s Available in %s\n", want.kubevirt, time.Since(start).Round(time.Second))
	installed = want
}

var _ = AfterSuite(func(ctx SpecContext) {
	if startedCluster && os.Getenv("E2E_KEEP_CLUSTER") == "" {
		Expect(run(ctx, clusterScript, "down")).To(Succeed())
	}
}, NodeTimeout(2*time.Minute))

func kubevirtAvailable(ctx context.Context) bool {
	out, err := kubectl(ctx, "-n", "kubevirt", "get", "kubevirt", "kubevirt",
		"-o", `jsonpath={.status.conditions[?(@.type=="Available")].status}`)
	return err == nil && out == "True"
}

var operatorImage = regexp.MustCompile(`(?m)^\s*image: (\S+/virt-operator\S*)$`)

// runsPatchedOperator reports whether virt-operator runs the image of the
// patched manifest `make images` wrote (not, say, what the upgrade specs
// left).
func runsPatchedOperator(ctx context.Context) bool {
	manifest, err := os.ReadFile(filepath.Join(testenv.KubeVirtOut(), "manifests", "kubevirt-operator.yaml"))
	if err != nil {
		return false
	}
	m := operatorImage.FindSubmatch(manifest)
	out, err := kubectl(ctx, "-n", "kubevirt", "get", "deployment", "virt-operator",
		"-o", "jsonpath={.spec.template.spec.containers[0].image}")
	return m != nil && err == nil && out == string(m[1])
}

// run runs a command with its output in the spec's log.
func run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = GinkgoWriter, GinkgoWriter
	return cmd.Run()
}

// kubectl runs kubectl against the cluster and returns its trimmed output;
// the error carries stderr.
func kubectl(ctx context.Context, args ...string) (string, error) {
	return kubectlIn(ctx, "", args...)
}

func kubectlIn(ctx context.Context, stdin string, args ...string) (string, error) {
	return command(ctx, stdin, kubectlBin, append([]string{"--kubeconfig", kubeconfig}, args...)...)
}

func virtctl(ctx context.Context, args ...string) (string, error) {
	return command(ctx, "", virtctlBin, append([]string{"--kubeconfig", kubeconfig}, args...)...)
}

func command(ctx context.Context, stdin, name string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return strings.TrimSpace(stdout.String()), fmt.Errorf("%s %s: %w: %s",
			filepath.Base(name), strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

// apply creates or updates objects from YAML.
func apply(ctx context.Context, yaml string) error {
	_, err := kubectlIn(ctx, yaml, "apply", "-f", "-")
	return err
}

// inNode runs a command inside the node's namespaces (files under
// /var/lib/kubelet exist only there).
func inNode(ctx context.Context, args ...string) (string, error) {
	return command(ctx, "", clusterScript, append([]string{"exec"}, args...)...)
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// Artifacts of a failed spec: everything in its namespaces and the node's
// logs. Taken in an AfterEach, which runs before the cleanups a spec
// defers: its VMs' pods and their logs are still there.
var _ = AfterEach(func(ctx SpecContext) {
	report := CurrentSpecReport()
	if !report.Failed() || kubectlBin == "" {
		return
	}
	dir := filepath.Join(artifactsDir, unsafeName.ReplaceAllString(report.FullText(), "_"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return
	}
	save := func(name string, args ...string) {
		out, err := kubectl(ctx, args...)
		if err != nil {
			out += "\n" + err.Error()
		}
		_ = os.WriteFile(filepath.Join(dir, name), []byte(out+"\n"), 0o644)
	}
	save("objects.txt", "get", "vm,vmi,pods,pvc,pv,events", "-A", "-o", "wide")
	save("events.txt", "get", "events", "-A", "--sort-by=.lastTimestamp")
	save("describe-vmi.txt", "describe", "vmi", "-A")
	save("describe-pods.txt", "describe", "pods", "-A")
	save("kubevirt.yaml", "-n", "kubevirt", "get", "kubevirt", "-o", "yaml")
	pods, _ := kubectl(ctx, "get", "pods", "-A", "-o",
		`jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name}{"\n"}{end}`)
	for _, p := range strings.Fields(pods) {
		ns, name, _ := strings.Cut(p, "/")
		save("logs-"+ns+"-"+name+".txt", "-n", ns, "logs", name, "--all-containers", "--prefix", "--tail=2000")
	}
	_ = exec.CommandContext(ctx, "cp", "-r", filepath.Join(clusterDir, "logs"), filepath.Join(dir, "node-logs")).Run()
	GinkgoWriter.Printf("artifacts in %s\n", dir)
}, NodeTimeout(2*time.Minute))
