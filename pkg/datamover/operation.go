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

package datamover

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// operation is a DataUpload or a DataDownload (phase type P) as the steps
// both controllers share see it. Their status types differ, so it points
// into the status.
type operation[P ~string] struct {
	kind              string
	obj               client.Object
	phase             *P
	message           *string
	start, completion **metav1.Time
	// temporaries are what the operation creates and its end deletes.
	temporaries []client.Object
	// release, when set, gives up what the operation holds before its
	// temporaries go (a volume it moves between claims).
	release func(context.Context) error

	client   client.Client
	recorder record.EventRecorder
	now      func() time.Time
	// metrics records the end; nil records nothing.
	metrics *Metrics
}

// setStatus changes the status with optimistic locking (a stale copy must
// not move an operation back) and records an event. A change that ends
// the operation is counted in the metrics once the write succeeded: the
// optimistic lock lets only one write move an operation from a live phase
// to an end, and an operation found ended (after a restart, or by another
// replica) is never ended again.
func (o *operation[P]) setStatus(ctx context.Context, eventType, reason, msg string, change func()) error {
	patch := client.MergeFromWithOptions(o.obj.DeepCopyObject().(client.Object), client.MergeFromWithOptimisticLock{})
	before := string(*o.phase)
	change()
	*o.message = msg
	if err := o.client.Patch(ctx, o.obj, patch); err != nil {
		return fmt.Errorf("update status of %s %s: %w", o.kind, client.ObjectKeyFromObject(o.obj), err)
	}
	if after := string(*o.phase); !phaseEnded(before) && phaseEnded(after) {
		o.metrics.ended(o.obj, after, *o.start, *o.completion)
	}
	logr.FromContextOrDiscard(ctx).Info(msg, "phase", *o.phase)
	o.recorder.Event(o.obj, eventType, reason, msg)
	return nil
}

// end sets the final phase; an operation that never started starts now.
func (o *operation[P]) end(phase P) {
	*o.phase = phase
	now := metav1.NewTime(o.now())
	if *o.start == nil {
		*o.start = ptr.To(now)
	}
	*o.completion = ptr.To(now)
}

// phaseName names a phase; Velero names the phases of both kinds alike.
func phaseName[P ~string](p P) string {
	if p == "" {
		return "New"
	}
	return string(p)
}

// cancelingPause is how long a Canceling operation waits before its
// temporary objects go.
const cancelingPause = time.Second

// cancel ends an operation Velero canceled: a live one goes Canceling
// while its temporary objects go, then Canceled.
func (o *operation[P]) cancel(ctx context.Context) (ctrl.Result, error) {
	switch *o.phase {
	case "Accepted", "Prepared", "InProgress":
		// Come back soon to delete the temporary objects and end it.
		return ctrl.Result{RequeueAfter: cancelingPause}, o.setStatus(ctx, corev1.EventTypeNormal, "Canceling", "canceling", func() { *o.phase = "Canceling" })
	}
	if err := o.deleteTemporaries(ctx); err != nil {
		return ctrl.Result{}, err
	}
	return o.finish(ctx, corev1.EventTypeNormal, "Canceled", "canceled", "Canceled")
}

func (o *operation[P]) fail(ctx context.Context, msg string) (ctrl.Result, error) {
	return o.finish(ctx, corev1.EventTypeWarning, "Failed", msg, "Failed")
}

// finish ends the operation in phase and deletes its temporary objects.
func (o *operation[P]) finish(ctx context.Context, eventType, reason, msg string, phase P) (ctrl.Result, error) {
	if err := o.setStatus(ctx, eventType, reason, msg, func() { o.end(phase) }); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, o.cleanup(ctx)
}

// cleanup deletes the temporary objects of a finished operation and
// records that in an annotation, so later reconciles skip it.
func (o *operation[P]) cleanup(ctx context.Context) error {
	if o.obj.GetAnnotations()[AnnotationCleanedUp] == "true" {
		return nil
	}
	if err := o.deleteTemporaries(ctx); err != nil {
		return err
	}
	patch := client.MergeFrom(o.obj.DeepCopyObject().(client.Object))
	annotations := o.obj.GetAnnotations()
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[AnnotationCleanedUp] = "true"
	o.obj.SetAnnotations(annotations)
	if err := o.client.Patch(ctx, o.obj, patch); err != nil {
		return fmt.Errorf("mark %s %s cleaned up: %w", o.kind, client.ObjectKeyFromObject(o.obj), err)
	}
	return nil
}

// deleteTemporaries releases what the operation holds and deletes its
// temporary objects.
func (o *operation[P]) deleteTemporaries(ctx context.Context) error {
	if o.release != nil {
		if err := o.release(ctx); err != nil {
			return err
		}
	}
	return deleteAll(ctx, o.client, o.temporaries...)
}

// result turns what a step returned into the reconcile's result: a fatal
// error fails the operation, a wait is reported once per message, and the
// next reconcile comes at the latest when the time left runs out.
func (o *operation[P]) result(ctx context.Context, err error, left time.Duration) (ctrl.Result, error) {
	var res ctrl.Result
	var wait *errWait
	switch {
	case isFatal(err):
		return o.fail(ctx, err.Error())
	case errors.As(err, &wait):
		if *o.message != wait.message {
			if err := o.setStatus(ctx, corev1.EventTypeNormal, wait.reason, wait.message, func() {}); err != nil {
				return ctrl.Result{}, err
			}
		}
		res.RequeueAfter = wait.after
	case err != nil:
		return ctrl.Result{}, err
	}
	if res.RequeueAfter == 0 || res.RequeueAfter > left {
		res.RequeueAfter = left
	}
	return res, nil
}
