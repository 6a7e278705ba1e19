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

package datamover_test

import (
	"archive/tar"
	"context"
	"crypto/x509"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/ociimage"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

// imageFiles reads the regular files of an image's file system.
func imageFiles(img v1.Image) map[string][]byte {
	rc := mutate.Extract(img)
	defer rc.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		Expect(err).NotTo(HaveOccurred())
		if h.Typeflag == tar.TypeReg {
			data, err := io.ReadAll(tr)
			Expect(err).NotTo(HaveOccurred())
			files["/"+strings.TrimPrefix(filepath.Clean("/"+h.Name), "/")] = data
		}
	}
}

var _ = Describe("the datamover's images", func() {
	It("run as non-root and trust the public authorities of the machine that built them", func(ctx context.Context) {
		const caBundle = "/etc/ssl/certs/ca-certificates.crt"
		hostBundle, err := os.ReadFile(caBundle)
		framework.Require(err, "the machine's CA bundle (ca-certificates)")
		out := GinkgoT().TempDir()
		cmd := exec.CommandContext(ctx, filepath.Join(testenv.RepoRoot(), "hack", "datamover-images.sh"), out, "registry.example.com/kubevirt-qcow2", "test")
		output, err := cmd.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "hack/datamover-images.sh: %s", output)

		const plugin = "/plugins/kubevirt-qcow2-velero-plugin"
		for name, want := range map[string]struct {
			user       string
			entrypoint []string
			caBundle   bool
		}{
			"datamover-controller": {"65532", []string{"/usr/bin/datamover-controller"}, true},
			"datamover":            {"107:107", []string{"/usr/bin/datamover-upload"}, true},
			// Velero's init container: it copies the plugin into the
			// plugins directory, where it runs in Velero's container.
			"velero-plugin": {"65532", []string{plugin, "install", "/target"}, false},
		} {
			img, err := ociimage.Load(ctx, ociimage.SourceLayout+filepath.Join(out, "images", name), v1.Platform{OS: "linux"})
			Expect(err).NotTo(HaveOccurred())
			cfg, err := img.ConfigFile()
			Expect(err).NotTo(HaveOccurred())
			Expect(cfg.Config.User).To(Equal(want.user), name)
			Expect(cfg.Config.Entrypoint).To(Equal(want.entrypoint), name)
			files := imageFiles(img)
			Expect(files).To(HaveKey(want.entrypoint[0]), name)
			// The docker archive that hack/cluster.sh import takes.
			Expect(filepath.Join(out, "images", name+".tar")).To(BeARegularFile(), name)
			if !want.caBundle {
				continue
			}
			Expect(files).To(HaveKey(caBundle), name)
			Expect(files[caBundle]).To(Equal(hostBundle), name)
			pool := x509.NewCertPool()
			Expect(pool.AppendCertsFromPEM(files[caBundle])).To(BeTrue(), name)
		}
	}, NodeTimeout(10*time.Minute))
})
