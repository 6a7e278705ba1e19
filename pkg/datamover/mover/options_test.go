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

package mover_test

import (
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/datamover/mover"
)

func upload() mover.UploadOptions {
	return mover.UploadOptions{
		VM: catalog.VM{Namespace: "prod", Name: "db"}, Backup: "tue",
		Checkpoint: "vmb-2026-11-30_06-40-12", Type: catalog.Incremental, Parent: "vmb-2026-11-29_06-40-01",
		VMBackup: "vmb", Source: "/backup", Credentials: "/credentials/cloud",
		Disks:     []mover.Disk{{Volume: "rootdisk", Name: "db-root"}, {Volume: "data", Name: "db-data"}},
		DiskSizes: map[string]string{"db-root": "10Gi"},
		Progress:  mover.ObjectRef{Namespace: "velero", Name: "tue-x7k2p"},
		BSL:       []byte(`{"kind":"BackupStorageLocation"}`), VMBackupJSON: []byte(`{"kind":"VirtualMachineBackup"}`),
	}
}

var _ = Describe("pod command lines", func() {
	It("read back an upload's options", func() {
		o := upload()
		env := o.Env()
		got, err := mover.ParseUpload(o.Args()[1:], func(k string) string { return env[k] })
		Expect(err).NotTo(HaveOccurred())
		Expect(o.Args()[0]).To(Equal(mover.CommandUpload))
		Expect(got).To(Equal(o))
	})

	It("read back a restore's options", func() {
		o := mover.RestoreOptions{VM: catalog.VM{Namespace: "prod", Name: "db"}, Backup: "tue", Disk: "db-root",
			Target: "/dev/target", WorkDir: "/work-dir", Credentials: "/credentials/cloud", BSL: []byte("{}")}
		env := o.Env()
		got, err := mover.ParseRestore(o.Args()[1:], func(k string) string { return env[k] })
		Expect(err).NotTo(HaveOccurred())
		Expect(got).To(Equal(o))
	})

	DescribeTable("refuse an upload that cannot be right",
		func(change func(*mover.UploadOptions), want string) {
			o := upload()
			change(&o)
			env := o.Env()
			_, err := mover.ParseUpload(o.Args()[1:], func(k string) string { return env[k] })
			Expect(err).To(MatchError(want))
		},
		Entry("no checkpoint", func(o *mover.UploadOptions) { o.Checkpoint = "" }, "upload: missing --checkpoint"),
		Entry("no disk and no location", func(o *mover.UploadOptions) { o.Disks, o.BSL = nil, nil },
			"upload: missing $DATAMOVER_BSL, --disk"),
		Entry("an incremental without parent", func(o *mover.UploadOptions) { o.Parent = "" },
			"upload: an incremental checkpoint needs --parent"),
		Entry("a full with a parent", func(o *mover.UploadOptions) { o.Type = catalog.Full },
			"upload: a full checkpoint has no parent (--parent=vmb-2026-11-29_06-40-01)"),
		Entry("an unknown type", func(o *mover.UploadOptions) { o.Type = "differential" },
			`upload: --type="differential": want full or incremental`),
	)

	It("refuses a malformed disk mapping", func() {
		_, err := mover.ParseUpload([]string{"--disk=rootdisk"}, func(string) string { return "" })
		Expect(err).To(MatchError(ContainSubstring(`"rootdisk": want <volume>=<disk>[:<size>]`)))
	})
})

var _ = Describe("FindDiskFile", func() {
	DescribeTable("finds the one file KubeVirt wrote for a volume",
		func(files []string, want string) {
			dir := GinkgoT().TempDir()
			for _, f := range files {
				Expect(os.MkdirAll(filepath.Join(dir, filepath.Dir(f)), 0o755)).To(Succeed())
				Expect(os.WriteFile(filepath.Join(dir, f), nil, 0o644)).To(Succeed())
			}
			got, err := mover.FindDiskFile(dir, "vmb", "rootdisk")
			if want == "" {
				Expect(err).NotTo(HaveOccurred())
				Expect(got).To(Equal(filepath.Join(dir, files[0])))
				return
			}
			Expect(err).To(MatchError(want))
		},
		Entry("one file", []string{"db/vmb-2026-11-30_06-40-12/vmb-rootdisk.qcow2", "db/vmb-2026-11-30_06-40-12/vmb-data.qcow2"}, ""),
		Entry("none", []string{"db/vmb-2026-11-30_06-40-12/vmb-data.qcow2"},
			"volume rootdisk: no file vmb-rootdisk.qcow2 on the backup volume"),
		Entry("two", []string{"db/a/vmb-rootdisk.qcow2", "db/b/vmb-rootdisk.qcow2"},
			"volume rootdisk: 2 files match vmb-rootdisk.qcow2 on the backup volume"),
	)
})
