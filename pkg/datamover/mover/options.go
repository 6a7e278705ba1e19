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

// Package mover is what the pods a DataUpload or DataDownload controller
// starts run: an upload pod streams the qcow2 files KubeVirt wrote onto a
// temporary volume to the backup storage location and records them; a
// restore pod rebuilds one disk from its chain onto the target volume. The
// controller builds a pod's command line from the options here, and the pod
// parses it back with the same code.
package mover

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/pkg/backup/catalog"
)

// Environment variables that carry what is too large or too structured for
// an argument.
const (
	// EnvBSL holds the BackupStorageLocation as JSON.
	EnvBSL = "DATAMOVER_BSL"
	// EnvVMBackup holds the VirtualMachineBackup as JSON, archived as
	// vmb.json beside the checkpoint.
	EnvVMBackup = "DATAMOVER_VMBACKUP"
	// EnvVMBackupTracker holds the VirtualMachineBackupTracker as JSON,
	// archived as vmbt.json.
	EnvVMBackupTracker = "DATAMOVER_VMBACKUP_TRACKER"
)

// Commands of the pod binary.
const (
	CommandUpload  = "upload"
	CommandRestore = "restore"
)

// Disk maps a volume of the VM, as KubeVirt names it in the backup's files,
// to the disk name recorded in the store: the name of the claim behind the
// volume, which is what a DataDownload's target volume names on restore.
type Disk struct {
	Volume string
	Name   string
}

// ObjectRef names the DataUpload or DataDownload a pod reports progress to.
type ObjectRef struct {
	Namespace string
	Name      string
}

// String is "<namespace>/<name>", or empty.
func (r ObjectRef) String() string {
	if r.Name == "" {
		return ""
	}
	return r.Namespace + "/" + r.Name
}

// UploadOptions tell an upload pod what to store.
type UploadOptions struct {
	VM catalog.VM
	// Backup is the Velero backup the checkpoint belongs to.
	Backup string
	// Checkpoint is KubeVirt's checkpoint name; Type and Parent are what
	// the VirtualMachineBackup reported.
	Checkpoint string
	Type       catalog.CheckpointType
	Parent     string
	// VMBackup is the VirtualMachineBackup whose files are uploaded; KubeVirt
	// names them "<VMBackup>-<volume>.qcow2".
	VMBackup string
	// Source is where the temporary volume is mounted.
	Source string
	Disks  []Disk
	// DiskSizes maps disk names to their capacity (a resource.Quantity).
	DiskSizes map[string]string
	// Credentials is the BSL's credentials file.
	Credentials string
	// Progress names the DataUpload whose status.progress the pod patches.
	Progress ObjectRef
	// BSL, VMBackupJSON and TrackerJSON come from the environment.
	BSL          []byte
	VMBackupJSON []byte
	TrackerJSON  []byte
}

// RestoreOptions tell a restore pod what to rebuild where.
type RestoreOptions struct {
	VM     catalog.VM
	Backup string
	Disk   string
	// Target is the raw file or block device receiving the disk.
	Target string
	// WorkDir holds the downloaded layers of a restore through staged
	// copies (backup.RestoreOptions.WorkDir).
	WorkDir     string
	Credentials string
	Progress    ObjectRef
	BSL         []byte
}

// Args is the pod's command line after the binary's name.
func (o UploadOptions) Args() []string {
	args := []string{CommandUpload,
		"--vm-namespace=" + o.VM.Namespace, "--vm-name=" + o.VM.Name,
		"--backup=" + o.Backup, "--checkpoint=" + o.Checkpoint,
		"--type=" + string(o.Type), "--vmbackup=" + o.VMBackup,
		"--source=" + o.Source, "--credentials=" + o.Credentials,
	}
	if o.Parent != "" {
		args = append(args, "--parent="+o.Parent)
	}
	for _, d := range o.Disks {
		arg := "--disk=" + d.Volume + "=" + d.Name
		if size := o.DiskSizes[d.Name]; size != "" {
			arg += ":" + size
		}
		args = append(args, arg)
	}
	if o.Progress.Name != "" {
		args = append(args, "--progress="+o.Progress.String())
	}
	return args
}

// Env is the pod's environment.
func (o UploadOptions) Env() map[string]string {
	env := map[string]string{EnvBSL: string(o.BSL)}
	if len(o.VMBackupJSON) > 0 {
		env[EnvVMBackup] = string(o.VMBackupJSON)
	}
	if len(o.TrackerJSON) > 0 {
		env[EnvVMBackupTracker] = string(o.TrackerJSON)
	}
	return env
}

// Args is the pod's command line after the binary's name.
func (o RestoreOptions) Args() []string {
	args := []string{CommandRestore,
		"--vm-namespace=" + o.VM.Namespace, "--vm-name=" + o.VM.Name,
		"--backup=" + o.Backup, "--disk=" + o.Disk, "--target=" + o.Target,
		"--work-dir=" + o.WorkDir, "--credentials=" + o.Credentials,
	}
	if o.Progress.Name != "" {
		args = append(args, "--progress="+o.Progress.String())
	}
	return args
}

// Env is the pod's environment.
func (o RestoreOptions) Env() map[string]string {
	return map[string]string{EnvBSL: string(o.BSL)}
}

// ParseUpload reads an upload pod's command line (after the command name)
// and environment.
func ParseUpload(args []string, getenv func(string) string) (UploadOptions, error) {
	var o UploadOptions
	var typ, progress string
	var disks diskFlag
	fs := newFlagSet(CommandUpload)
	fs.StringVar(&o.VM.Namespace, "vm-namespace", "", "namespace of the VirtualMachine")
	fs.StringVar(&o.VM.Name, "vm-name", "", "name of the VirtualMachine")
	fs.StringVar(&o.Backup, "backup", "", "Velero backup")
	fs.StringVar(&o.Checkpoint, "checkpoint", "", "KubeVirt's checkpoint name")
	fs.StringVar(&typ, "type", "", "full or incremental")
	fs.StringVar(&o.Parent, "parent", "", "parent checkpoint of an incremental")
	fs.StringVar(&o.VMBackup, "vmbackup", "", "VirtualMachineBackup that wrote the files")
	fs.StringVar(&o.Source, "source", "", "mount point of the backup volume")
	fs.StringVar(&o.Credentials, "credentials", "", "credentials file of the backup storage location")
	fs.StringVar(&progress, "progress", "", "<namespace>/<name> of the DataUpload to report progress to")
	fs.Var(&disks, "disk", "<volume>=<disk>[:<size>], repeated")
	if err := fs.Parse(args); err != nil {
		return o, fmt.Errorf("upload: %w", err)
	}
	o.Type = catalog.CheckpointType(typ)
	o.Disks, o.DiskSizes = disks.disks, disks.sizes
	var err error
	if o.Progress, err = parseRef(progress); err != nil {
		return o, fmt.Errorf("upload: %w", err)
	}
	o.BSL = envBytes(getenv, EnvBSL)
	o.VMBackupJSON = envBytes(getenv, EnvVMBackup)
	o.TrackerJSON = envBytes(getenv, EnvVMBackupTracker)
	return o, o.validate()
}

// ParseRestore reads a restore pod's command line (after the command name)
// and environment.
func ParseRestore(args []string, getenv func(string) string) (RestoreOptions, error) {
	var o RestoreOptions
	var progress string
	fs := newFlagSet(CommandRestore)
	fs.StringVar(&o.VM.Namespace, "vm-namespace", "", "namespace of the VirtualMachine")
	fs.StringVar(&o.VM.Name, "vm-name", "", "name of the VirtualMachine")
	fs.StringVar(&o.Backup, "backup", "", "Velero backup to restore from")
	fs.StringVar(&o.Disk, "disk", "", "disk to restore")
	fs.StringVar(&o.Target, "target", "", "raw file or block device receiving the disk")
	fs.StringVar(&o.WorkDir, "work-dir", "", "directory for the downloaded layers of a restore through staged copies")
	fs.StringVar(&o.Credentials, "credentials", "", "credentials file of the backup storage location")
	fs.StringVar(&progress, "progress", "", "<namespace>/<name> of the DataDownload to report progress to")
	if err := fs.Parse(args); err != nil {
		return o, fmt.Errorf("restore: %w", err)
	}
	var err error
	if o.Progress, err = parseRef(progress); err != nil {
		return o, fmt.Errorf("restore: %w", err)
	}
	o.BSL = envBytes(getenv, EnvBSL)
	var missing []string
	for flag, v := range map[string]string{"vm-namespace": o.VM.Namespace, "vm-name": o.VM.Name,
		"backup": o.Backup, "disk": o.Disk, "target": o.Target, "credentials": o.Credentials} {
		if v == "" {
			missing = append(missing, "--"+flag)
		}
	}
	if len(o.BSL) == 0 {
		missing = append(missing, "$"+EnvBSL)
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return o, fmt.Errorf("restore: missing %s", strings.Join(missing, ", "))
	}
	return o, nil
}

func (o UploadOptions) validate() error {
	var missing []string
	for flag, v := range map[string]string{"vm-namespace": o.VM.Namespace, "vm-name": o.VM.Name,
		"backup": o.Backup, "checkpoint": o.Checkpoint, "vmbackup": o.VMBackup,
		"source": o.Source, "credentials": o.Credentials} {
		if v == "" {
			missing = append(missing, "--"+flag)
		}
	}
	if len(o.Disks) == 0 {
		missing = append(missing, "--disk")
	}
	if len(o.BSL) == 0 {
		missing = append(missing, "$"+EnvBSL)
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return fmt.Errorf("upload: missing %s", strings.Join(missing, ", "))
	}
	switch o.Type {
	case catalog.Full:
		if o.Parent != "" {
			return fmt.Errorf("upload: a full checkpoint has no parent (--parent=%s)", o.Parent)
		}
	case catalog.Incremental:
		if o.Parent == "" {
			return errors.New("upload: an incremental checkpoint needs --parent")
		}
	default:
		return fmt.Errorf("upload: --type=%q: want %s or %s", o.Type, catalog.Full, catalog.Incremental)
	}
	return nil
}

func envBytes(getenv func(string) string, key string) []byte {
	if v := getenv(key); v != "" {
		return []byte(v)
	}
	return nil
}

func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

func parseRef(s string) (ObjectRef, error) {
	if s == "" {
		return ObjectRef{}, nil
	}
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" {
		return ObjectRef{}, fmt.Errorf("--progress=%q: want <namespace>/<name>", s)
	}
	return ObjectRef{Namespace: ns, Name: name}, nil
}

type diskFlag struct {
	disks []Disk
	sizes map[string]string
}

func (d *diskFlag) String() string { return "" }

func (d *diskFlag) Set(v string) error {
	volume, rest, ok := strings.Cut(v, "=")
	name, size, _ := strings.Cut(rest, ":")
	if !ok || volume == "" || name == "" {
		return fmt.Errorf("%q: want <volume>=<disk>[:<size>]", v)
	}
	d.disks = append(d.disks, Disk{Volume: volume, Name: name})
	if size != "" {
		if d.sizes == nil {
			d.sizes = map[string]string{}
		}
		d.sizes[name] = size
	}
	return nil
}
