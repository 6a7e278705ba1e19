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

package e2e_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/internal/testenv"
)

// namespace holds every object the specs create.
const namespace = "e2e"

const nodeName = "kubevirt-qcow2-node"

// clusterNodes names the running cluster's nodes, as hack/cluster.sh names
// them: the first, then kubevirt-qcow2-node2 and on.
func clusterNodes() []string {
	names := []string{nodeName}
	for i := 2; i <= installed.nodes; i++ {
		names = append(names, fmt.Sprintf("%s%d", nodeName, i))
	}
	return names
}

// guestParams is what the golden image's test guest writes: 1 MiB after
// its boot sector, then DONE on the serial console.
var guestParams = testenv.GuestParams{StartLBA: 2048, Sectors: 2048, ProgressEvery: 4, Seed: 0x5eed}

const goldenSize = 64 << 20

// volumesDir holds the static local volumes' files and directories; it lies
// under the cluster's directory, so `hack/cluster.sh down` releases the
// loop devices made from it.
var volumesDir = filepath.Join(clusterDir, "volumes")

// localClaim makes a static local PersistentVolume for path and a claim
// bound to it, as an administrator without a provisioner would. Every node
// of the cluster sees the machine's directories and devices: the volume is
// on all of them, and a ReadWriteMany one is shared storage.
func localClaim(ctx context.Context, name, path, volumeMode, accessMode string, size int64) {
	Expect(apply(ctx, fmt.Sprintf(`
apiVersion: v1
kind: PersistentVolume
metadata: {name: %[1]s, labels: {e2e: "true"}}
spec:
  capacity: {storage: "%[4]d"}
  accessModes: [%[5]s]
  volumeMode: %[3]s
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  local: {path: %[2]s}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [%[6]s]}]
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: %[1]s, namespace: %[7]s}
spec:
  accessModes: [%[5]s]
  volumeMode: %[3]s
  storageClassName: ""
  volumeName: %[1]s
  resources: {requests: {storage: "%[4]d"}}
`, name, path, volumeMode, size, accessMode, strings.Join(clusterNodes(), ", "), namespace))).To(Succeed())
}

// goldenFilesystem makes the boot-sector guest the golden image, disk.img
// on a Filesystem claim.
func goldenFilesystem(ctx context.Context, name string) {
	goldenClaim(ctx, name, func(image string) {
		Expect(testenv.CreateBootDisk(ctx, image, goldenSize, guestParams)).To(Succeed())
	})
}

// goldenClaim makes disk.img, written by fill, on a read-only Filesystem
// claim of its own and returns the image's path on this machine.
func goldenClaim(ctx context.Context, name string, fill func(image string)) string {
	dir := filepath.Join(volumesDir, name)
	Expect(os.RemoveAll(dir)).To(Succeed())
	Expect(os.MkdirAll(dir, 0o755)).To(Succeed())
	image := filepath.Join(dir, "disk.img")
	fill(image)
	localClaim(ctx, name, dir, "Filesystem", "ReadOnlyMany", fileSize(image))
	return image
}

// emptyFilesystemClaim is a claim on an empty directory.
func emptyFilesystemClaim(ctx context.Context, name string, size int64) string {
	return emptyFilesystemClaimWithAccess(ctx, name, size, "ReadWriteOnce")
}

// emptyFilesystemClaimWithAccess is emptyFilesystemClaim with the given
// access mode.
func emptyFilesystemClaimWithAccess(ctx context.Context, name string, size int64, accessMode string) string {
	dir := filepath.Join(volumesDir, name)
	Expect(os.RemoveAll(dir)).To(Succeed())
	Expect(os.MkdirAll(dir, 0o755)).To(Succeed())
	localClaim(ctx, name, dir, "Filesystem", accessMode, size)
	return dir
}

// blockClaim is a Block-mode claim on a loop device over a new sparse file
// of size bytes; it returns the device.
func blockClaim(ctx context.Context, name string, size int64) string {
	return blockClaimWithAccess(ctx, name, size, "ReadWriteOnce")
}

// blockClaimWithAccess is blockClaim with the given access mode.
func blockClaimWithAccess(ctx context.Context, name string, size int64, accessMode string) string {
	Expect(os.MkdirAll(volumesDir, 0o755)).To(Succeed())
	file := filepath.Join(volumesDir, name+".img")
	Expect(os.RemoveAll(file)).To(Succeed())
	dev, err := testenv.CreateLoopFile(ctx, file, size)
	Expect(err).ToNot(HaveOccurred())
	localClaim(ctx, name, dev, "Block", accessMode, size)
	return dev
}
