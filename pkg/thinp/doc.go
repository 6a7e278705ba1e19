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

// Package thinp keeps a thin-provisioned qcow2 disk of a running libvirt
// domain ahead of its guest's writes: the image sits on a block device that
// starts small, and the package grows the device by chunks before the
// guest's writes reach its end.
//
// For every monitored disk a Monitor arms a libvirt block write threshold
// on the node of the image that lives on the block device, extends the
// device when the threshold fires (or when a periodic poll finds the free
// space below the threshold, in case an event was missed), checks that QEMU
// sees the new size and arms the next threshold. When the guest outran the
// extension and the domain paused on ENOSPC, the Monitor extends and, as
// its policy says, resumes the domain.
//
// Each disk moves through these states:
//
//	        arm                 threshold event / poll / ENOSPC
//	Unarmed ────▶ Armed ───────────────────────────────────────▶ Exceeded
//	   ▲                                                             │
//	   │ extended, size visible to QEMU                               │ extend
//	   └──────────────────────────── Extending ◀─────────────────────┘
//	                                      │   (failure: back to Exceeded,
//	                                      │    retried on the next poll)
//	                                      ▼
//	                                  AtMaximum   (device holds the fully
//	                                               allocated image: nothing
//	                                               left to arm)
//
// Device growth is the job of an Extender: a loop device, an LVM logical
// volume or a Kubernetes PersistentVolumeClaim. The package knows nothing
// of KubeVirt.
package thinp
