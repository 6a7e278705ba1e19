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

package catalog

import (
	"crypto/sha256"
	"encoding/hex"
	"path"
	"strings"
)

// Dir names the directory of everything the datamover stores.
const Dir = "kubevirt-datamover"

// Root is the datamover's directory in the bucket of a backup storage
// location whose prefix is bslPrefix. The documents' paths, and the keys
// of a store opened at Root, are relative to it.
//
// Velero owns the prefix: its validation marks a location Unavailable, and
// stops every backup to it, as soon as a directory other than its own
// (backups/, restores/, kopia/, …) appears right under the prefix. The
// root is therefore the prefix's sibling, "<prefix>-kubevirt-datamover", as
// OADP's datamover names it. Without a prefix Velero owns the bucket's
// whole top level; the root is then "plugins/kubevirt-datamover", under
// the directory Velero's layout sets aside for plugins' data.
func Root(bslPrefix string) string {
	prefix := strings.Trim(bslPrefix, "/")
	if prefix == "" {
		return path.Join("plugins", Dir)
	}
	return prefix + "-" + Dir
}

// LegacyRoot is where earlier releases kept the datamover's objects,
// "<prefix>/kubevirt-datamover": a directory Velero refuses. Restores
// still read the backups there; nothing is written there any more.
func LegacyRoot(bslPrefix string) string { return path.Join(strings.Trim(bslPrefix, "/"), Dir) }

// VM names a virtual machine.
type VM struct {
	Namespace string
	Name      string
}

func (v VM) String() string { return v.Namespace + "/" + v.Name }

// VMDir is checkpoints/<ns>/<vm>/, relative to the root.
func VMDir(vm VM) string { return path.Join("checkpoints", vm.Namespace, vm.Name) + "/" }

// VMIndexPath is checkpoints/<ns>/<vm>/index.json, relative to the root.
func VMIndexPath(vm VM) string { return path.Join("checkpoints", vm.Namespace, vm.Name, "index.json") }

// CheckpointDir is checkpoints/<ns>/<vm>/<checkpoint>/, relative to the root.
func CheckpointDir(vm VM, checkpoint string) string {
	return path.Join("checkpoints", vm.Namespace, vm.Name, checkpoint) + "/"
}

// DiskFilename is the object name of one disk of a checkpoint:
// <backup>-<disk>.qcow2.
func DiskFilename(backup, disk string) string { return backup + "-" + disk + ".qcow2" }

// DiskPath is the object of one disk of a checkpoint, relative to the root.
func DiskPath(vm VM, checkpoint, backup, disk string) string {
	return path.Join(CheckpointDir(vm, checkpoint), DiskFilename(backup, disk))
}

// AttachmentPath is a named side file of a checkpoint (vmb.json,
// vmbt.json), relative to the root.
func AttachmentPath(vm VM, checkpoint, name string) string {
	return path.Join(CheckpointDir(vm, checkpoint), name)
}

// BackupDir is manifests/<backup>/, relative to the root.
func BackupDir(backup string) string { return path.Join("manifests", backup) + "/" }

// BackupIndexPath is manifests/<backup>/index.json, relative to the root.
func BackupIndexPath(backup string) string { return path.Join("manifests", backup, "index.json") }

// VMManifestPath is manifests/<backup>/<ns>-<vm>.json, relative to the root.
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
// the root.
func ParseVMIndexPath(rel string) (VM, bool) {
	parts := strings.Split(rel, "/")
	if len(parts) != 4 || parts[0] != "checkpoints" || parts[3] != "index.json" {
		return VM{}, false
	}
	return VM{Namespace: parts[1], Name: parts[2]}, true
}

// ParseBackupIndexPath recognizes manifests/<backup>/index.json relative to
// the root.
func ParseBackupIndexPath(rel string) (string, bool) {
	parts := strings.Split(rel, "/")
	if len(parts) != 3 || parts[0] != "manifests" || parts[2] != "index.json" {
		return "", false
	}
	return parts[1], true
}
