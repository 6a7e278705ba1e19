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

// Package deploy_test renders the kustomizations under deploy/ in-process
// with kustomize (the version kubectl 1.33 embeds) and applies them to a
// real kube-apiserver and etcd (envtest) with the patched tree's KubeVirt
// CRDs, Velero's and KubeVirt's backup CRDs installed.
package deploy_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/rest"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv/apiserver"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

func TestDeploy(t *testing.T) {
	framework.RunSuite(t, "Install manifests Suite")
}

// crdTool renders the CRDs virt-operator installs, from the tree it is
// built in; the overlay admission suite's tool, reused.
const crdTool = "tools/deploy-crds"

var apiConfig *rest.Config

var _ = BeforeSuite(func(ctx SpecContext) {
	framework.SetupLogger()
	tree := testenv.KubeVirtTree()
	_, err := os.Stat(filepath.Join(tree, "pkg", "storage", "admitters", "overlay.go"))
	framework.Require(err, "the patched KubeVirt tree (hack/kubevirt.sh apply)")

	work := GinkgoT().TempDir()
	source, err := filepath.Abs(filepath.Join("..", "overlayadmission", "testdata", "crds", "main.go"))
	Expect(err).ToNot(HaveOccurred())
	bin := filepath.Join(work, "bin")
	Expect(testenv.BuildInKubeVirtTree(context.Background(), map[string]string{crdTool: source}, bin)).To(Succeed())
	crdDir := filepath.Join(work, "crds")
	out, err := exec.Command(filepath.Join(bin, filepath.Base(crdTool)), "--out", crdDir).CombinedOutput()
	Expect(err).ToNot(HaveOccurred(), "render the patched CRDs: %s", out)

	crds := append([]string{crdDir}, veleroCRDs()...)
	backupCRDs, err := filepath.Glob(filepath.Join("..", "datamover", "testdata", "backup.kubevirt.io_*.yaml"))
	Expect(err).ToNot(HaveOccurred())
	Expect(backupCRDs).To(HaveLen(2))
	server, err := apiserver.Start(ctx, append(crds, backupCRDs...)...)
	framework.Require(err, "kube-apiserver and etcd")
	DeferCleanup(server.Stop)
	apiConfig = server.Config
})

// veleroCRDs are the CRDs of the Velero objects the data mover serves, as
// the Velero module ships them.
func veleroCRDs() []string {
	dir, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/vmware-tanzu/velero").Output()
	Expect(err).ToNot(HaveOccurred(), "locate the velero module")
	crds := filepath.Join(strings.TrimSpace(string(dir)), "config", "crd")
	return []string{
		filepath.Join(crds, "v2alpha1", "bases", "velero.io_datauploads.yaml"),
		filepath.Join(crds, "v2alpha1", "bases", "velero.io_datadownloads.yaml"),
		filepath.Join(crds, "v1", "bases", "velero.io_backupstoragelocations.yaml"),
	}
}
