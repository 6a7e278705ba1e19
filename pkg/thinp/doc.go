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
