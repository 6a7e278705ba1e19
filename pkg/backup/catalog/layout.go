package catalog

import (
	"crypto/sha256"
	"encoding/hex"
	"path"
	"strings"
)

// Root is the directory of everything the datamover stores, under the
// backup storage location's prefix, beside Velero's backups/ and restores/.
const Root = "kubevirt-datamover"

// VM names a virtual machine.
type VM struct {
	Namespace string
	Name      string
}

func (v VM) String() string { return v.Namespace + "/" + v.Name }

// Key turns a path relative to Root (as documents record them) into a
// store key.
func Key(rel string) string { return path.Join(Root, rel) }

// VMDir is checkpoints/<ns>/<vm>/, relative to Root.
func VMDir(vm VM) string { return path.Join("checkpoints", vm.Namespace, vm.Name) + "/" }

// VMIndexPath is checkpoints/<ns>/<vm>/index.json, relative to Root.
func VMIndexPath(vm VM) string { return path.Join("checkpoints", vm.Namespace, vm.Name, "index.json") }

// CheckpointDir is checkpoints/<ns>/<vm>/<checkpoint>/, relative to Root.
func CheckpointDir(vm VM, checkpoint string) string {
	return path.Join("checkpoints", vm.Namespace, vm.Name, checkpoint) + "/"
}

// DiskFilename is the object name of one disk of a checkpoint:
// <backup>-<disk>.qcow2.
func DiskFilename(backup, disk string) string { return backup + "-" + disk + ".qcow2" }

// DiskPath is the object of one disk of a checkpoint, relative to Root.
func DiskPath(vm VM, checkpoint, backup, disk string) string {
	return path.Join(CheckpointDir(vm, checkpoint), DiskFilename(backup, disk))
}

// AttachmentPath is a named side file of a checkpoint (vmb.json,
// vmbt.json), relative to Root.
func AttachmentPath(vm VM, checkpoint, name string) string {
	return path.Join(CheckpointDir(vm, checkpoint), name)
}

// BackupDir is manifests/<backup>/, relative to Root.
func BackupDir(backup string) string { return path.Join("manifests", backup) + "/" }

// BackupIndexPath is manifests/<backup>/index.json, relative to Root.
func BackupIndexPath(backup string) string { return path.Join("manifests", backup, "index.json") }

// VMManifestPath is manifests/<backup>/<ns>-<vm>.json, relative to Root.
// "<ns>-<vm>" is ambiguous when names contain dashes; colliding VMs of one
// backup get a digest suffix (see DisambiguatedVMManifestPath).
func VMManifestPath(backup string, vm VM) string {
	return path.Join("manifests", backup, vm.Namespace+"-"+vm.Name+".json")
}

// DisambiguatedVMManifestPath is the manifest path used when
// VMManifestPath already holds another VM's manifest.
func DisambiguatedVMManifestPath(backup string, vm VM) string {
	sum := sha256.Sum256([]byte(vm.Namespace + "/" + vm.Name))
	return path.Join("manifests", backup, vm.Namespace+"-"+vm.Name+"-"+hex.EncodeToString(sum[:4])+".json")
}

// ParseVMIndexPath recognizes checkpoints/<ns>/<vm>/index.json relative to
// Root.
func ParseVMIndexPath(rel string) (VM, bool) {
	parts := strings.Split(rel, "/")
	if len(parts) != 4 || parts[0] != "checkpoints" || parts[3] != "index.json" {
		return VM{}, false
	}
	return VM{Namespace: parts[1], Name: parts[2]}, true
}

// ParseBackupIndexPath recognizes manifests/<backup>/index.json relative to
// Root.
func ParseBackupIndexPath(rel string) (string, bool) {
	parts := strings.Split(rel, "/")
	if len(parts) != 3 || parts[0] != "manifests" || parts[2] != "index.json" {
		return "", false
	}
	return parts[1], true
}
