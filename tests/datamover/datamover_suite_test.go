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

// Package datamover_test is the functional suite of the KubeVirt data mover
// controller: a real kube-apiserver and etcd (envtest) with Velero's CRDs
// and minimal KubeVirt ones, a real S3 server on loopback, and stand-ins for
// what does not run here — KubeVirt executing VirtualMachineBackups (with
// real qcow2 files), the kubelet running the controller's pods (with the
// pod binary's own code), and the volume controllers and a provisioner
// binding claims to volumes (host directories).
package datamover_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv/apiserver"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv/s3server"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

func TestDatamover(t *testing.T) {
	framework.RunSuite(t, "datamover functional Suite")
}

const (
	veleroNamespace = "velero"
	credentialsName = "cloud-credentials"
	identity        = "datamover-suite"
)

var (
	s3Binary string
	// kubeconfig reaches the API server, for commands the specs run.
	kubeconfig []byte
	// k8s also watches, for specs that must see every change.
	k8s    client.WithWatch
	scheme *runtime.Scheme
	s3     *s3server.Server
	vols   volumes
	// metricsURL is the controller's metrics endpoint.
	metricsURL string
	kubevirt   *kubeVirtStandIn
	kubelet    *kubeletStandIn
)

var _ = BeforeSuite(func(ctx context.Context) {
	framework.SetupLogger()
	var err error
	s3Binary, err = s3server.Binary(ctx, testenv.RepoRoot())
	framework.Require(err, "the S3 server build (hack/s3-server.sh)")
	_, err = exec.LookPath("qemu-img")
	framework.Require(err, "qemu-img")

	veleroCRDs := veleroCRDPaths(ctx)
	api, err := apiserver.Start(ctx, append(veleroCRDs, "testdata")...)
	framework.Require(err, "kube-apiserver and etcd (envtest)")
	DeferCleanup(api.Stop)
	kubeconfig = api.Env.KubeConfig

	scheme, err = datamover.NewScheme()
	Expect(err).NotTo(HaveOccurred())
	k8s, err = client.NewWithWatch(api.Config, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())

	s3, err = s3server.Start(ctx, s3Binary, GinkgoT().TempDir())
	framework.Require(err, "the S3 server (versitygw)")
	DeferCleanup(s3.Stop)

	Expect(k8s.Create(ctx, restrictedNamespace(veleroNamespace))).To(Succeed())
	Expect(k8s.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: credentialsName, Namespace: veleroNamespace},
		StringData: map[string]string{"cloud": "[default]\naws_access_key_id = " + s3.AccessKey +
			"\naws_secret_access_key = " + s3.SecretKey + "\n"},
	})).To(Succeed())

	port, err := testenv.FreePort()
	Expect(err).NotTo(HaveOccurred())
	metricsAddress := fmt.Sprintf("127.0.0.1:%d", port)
	metricsURL = "http://" + metricsAddress + "/metrics"
	mgr, err := ctrl.NewManager(api.Config, ctrl.Options{
		Scheme:                 scheme,
		Cache:                  datamover.CacheOptions(veleroNamespace),
		Metrics:                metricsserver.Options{BindAddress: metricsAddress},
		HealthProbeBindAddress: "0",
	})
	Expect(err).NotTo(HaveOccurred())
	runCtx, stop := context.WithCancel(context.Background())
	DeferCleanup(stop)
	Expect(datamover.Setup(runCtx, mgr, datamover.Config{
		Identity:       identity,
		Image:          "datamover-upload:suite",
		DefaultTimeout: 10 * time.Minute,
		PollInterval:   500 * time.Millisecond,
	})).To(Succeed())
	go func() {
		defer GinkgoRecover()
		Expect(mgr.Start(runCtx)).To(Succeed())
	}()

	vols = volumes{root: GinkgoT().TempDir()}
	kubevirt = newKubeVirtStandIn(k8s, vols)
	kubelet = newKubeletStandIn(k8s, vols, GinkgoT().TempDir())
	volumeController := &volumeControllerStandIn{c: k8s, vols: vols}
	go kubevirt.run(runCtx)
	go kubelet.run(runCtx)
	go volumeController.run(runCtx)
}, NodeTimeout(15*time.Minute))

// veleroCRDPaths are the DataUpload, DataDownload, BackupStorageLocation,
// Backup and Restore CRDs as the Velero module ships them.
func veleroCRDPaths(ctx context.Context) []string {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/vmware-tanzu/velero").Output()
	Expect(err).NotTo(HaveOccurred(), "locate the velero module")
	dir := strings.TrimSpace(string(out))
	return []string{
		filepath.Join(dir, "config", "crd", "v2alpha1", "bases", "velero.io_datauploads.yaml"),
		filepath.Join(dir, "config", "crd", "v2alpha1", "bases", "velero.io_datadownloads.yaml"),
		filepath.Join(dir, "config", "crd", "v1", "bases", "velero.io_backupstoragelocations.yaml"),
		filepath.Join(dir, "config", "crd", "v1", "bases", "velero.io_backups.yaml"),
		filepath.Join(dir, "config", "crd", "v1", "bases", "velero.io_restores.yaml"),
	}
}
