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

package kubevirtbackup_test

import (
	"encoding/json"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/kubevirtbackup"
)

func TestKubevirtbackup(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "kubevirtbackup Suite")
}

// decode reads a VirtualMachineBackup's status, conditions as given, the
// way the datamover reads it from the API server.
func decode(conditions string) *kubevirtbackup.VMBackup {
	u := &unstructured.Unstructured{}
	ExpectWithOffset(1, json.Unmarshal([]byte(`{
		"apiVersion": "backup.kubevirt.io/v1alpha1",
		"kind": "VirtualMachineBackup",
		"metadata": {"name": "nightly", "namespace": "prod"},
		"spec": {"source": {"kind": "VirtualMachineBackupTracker", "name": "db"}, "mode": "Push", "pvcName": "nightly"},
		"status": {"type": "Full", "checkpointName": "cp-1", "conditions": `+conditions+`}
	}`), &u.Object)).To(Succeed())
	vmb := &kubevirtbackup.VMBackup{}
	ExpectWithOffset(1, kubevirtbackup.FromUnstructured(u, vmb)).To(Succeed())
	return vmb
}

var _ = Describe("the end of a VirtualMachineBackup", func() {
	DescribeTable("is read as KubeVirt reports it", func(conditions string, succeeded, failed bool, cause string) {
		vmb := decode(conditions)
		Expect(vmb.Succeeded()).To(Equal(succeeded), "Succeeded")
		gotFailed, gotCause := vmb.Failed()
		Expect(gotFailed).To(Equal(failed), "Failed")
		Expect(gotCause).To(Equal(cause))
		Expect(vmb.Status.CheckpointName).To(Equal("cp-1"))
	},
		// KubeVirt v1.8.0 (pkg/storage/cbt/backup.go): its own Condition
		// type, with lastProbeTime, and Done True at the end, failed or not.
		Entry("v1.8: in progress", `[
			{"type": "Progressing", "status": "True", "reason": "Backup is in progress", "lastProbeTime": null, "lastTransitionTime": "2026-12-02T10:00:00Z"},
			{"type": "Done", "status": "False", "reason": "Backup is in progress", "lastProbeTime": null, "lastTransitionTime": "2026-12-02T10:00:00Z"}]`,
			false, false, ""),
		Entry("v1.8: completed", `[
			{"type": "Progressing", "status": "False", "reason": "Successfully completed VirtualMachineBackup", "lastProbeTime": null, "lastTransitionTime": "2026-12-02T10:01:00Z"},
			{"type": "Done", "status": "True", "reason": "Successfully completed VirtualMachineBackup", "lastProbeTime": null, "lastTransitionTime": "2026-12-02T10:01:00Z"}]`,
			true, false, ""),
		Entry("v1.8: completed with a warning", `[
			{"type": "Done", "status": "True", "reason": "Completed VirtualMachineBackup, warning: quiesce failed", "lastProbeTime": null, "lastTransitionTime": null}]`,
			true, false, ""),
		Entry("v1.8: failed", `[
			{"type": "Progressing", "status": "False", "reason": "Backup has failed: VMI is not in a running state", "lastProbeTime": null, "lastTransitionTime": "2026-12-02T10:01:00Z"},
			{"type": "Done", "status": "True", "reason": "Backup has failed: VMI is not in a running state", "lastProbeTime": null, "lastTransitionTime": "2026-12-02T10:01:00Z"}]`,
			false, true, "VMI is not in a running state"),
		Entry("v1.8: aborting, not done yet", `[
			{"type": "Aborting", "status": "True", "reason": "Backup is aborting", "lastProbeTime": null, "lastTransitionTime": null},
			{"type": "Done", "status": "False", "reason": "Backup is in progress", "lastProbeTime": null, "lastTransitionTime": null}]`,
			false, false, ""),
		// KubeVirt v1.9 (kubevirt.io/api v1.9.0): metav1.Condition, Complete
		// or Failed True at the end, the cause in the message.
		Entry("v1.9: in progress", `[
			{"type": "Progressing", "status": "True", "reason": "Initiated", "message": "Backup is in progress", "lastTransitionTime": "2026-12-02T10:00:00Z"}]`,
			false, false, ""),
		Entry("v1.9: completed", `[
			{"type": "Progressing", "status": "False", "reason": "Completed", "message": "", "lastTransitionTime": "2026-12-02T10:01:00Z"},
			{"type": "Complete", "status": "True", "reason": "Completed", "message": "Successfully completed VirtualMachineBackup", "lastTransitionTime": "2026-12-02T10:01:00Z"}]`,
			true, false, ""),
		Entry("v1.9: failed", `[
			{"type": "Complete", "status": "False", "reason": "Failed", "message": "", "lastTransitionTime": "2026-12-02T10:01:00Z"},
			{"type": "Failed", "status": "True", "reason": "Failed", "message": "domain not running", "lastTransitionTime": "2026-12-02T10:01:00Z"}]`,
			false, true, "domain not running"),
		Entry("no conditions yet", `[]`, false, false, ""),
	)

	It("is not reported before KubeVirt wrote a status", func() {
		vmb := &kubevirtbackup.VMBackup{}
		Expect(vmb.Succeeded()).To(BeFalse())
		failed, cause := vmb.Failed()
		Expect(failed).To(BeFalse())
		Expect(cause).To(BeEmpty())
	})
})

var _ = Describe("what a VirtualMachineBackup is doing", func() {
	DescribeTable("is its True conditions with their reasons", func(conditions, stage string) {
		Expect(decode(conditions).Stage()).To(Equal(stage))
	},
		// KubeVirt v1.8.3 keeps a backup it cannot start yet Initializing,
		// saying why (pkg/storage/cbt/backup.go).
		Entry("v1.8: waiting to start", `[
			{"type": "Initializing", "status": "True", "reason": "Waiting for checkpoint redefinition on tracker db", "lastProbeTime": null, "lastTransitionTime": null},
			{"type": "Progressing", "status": "False", "reason": "Waiting for checkpoint redefinition on tracker db", "lastProbeTime": null, "lastTransitionTime": null}]`,
			"Initializing: Waiting for checkpoint redefinition on tracker db"),
		Entry("v1.8: in progress", `[
			{"type": "Progressing", "status": "True", "reason": "Backup is in progress", "lastProbeTime": null, "lastTransitionTime": null},
			{"type": "Done", "status": "False", "reason": "Backup is in progress", "lastProbeTime": null, "lastTransitionTime": null}]`,
			"Progressing: Backup is in progress"),
		Entry("no reason", `[{"type": "Progressing", "status": "True", "reason": "", "lastProbeTime": null, "lastTransitionTime": null}]`,
			"Progressing"),
		Entry("no conditions yet", `[]`, ""),
	)
})
