package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/kubevirt-qcow2/kubevirt-qcow2/tests/framework"
)

// Where virt-launcher's compute container keeps an ephemeral overlay.
var ephemeralOverlay = framework.OverlayEphemeralImage("rootdisk")

// allocatedInTop is how many bytes of the guest's written range the top
// image of a chain holds, read with qemu-img inside the launcher pod while
// QEMU runs (-U: QEMU holds the lock).
func allocatedInTop(ctx context.Context, pod, image string) int64 {
	out, err := kubectl(ctx, "-n", namespace, "exec", pod, "-c", "compute", "--",
		"qemu-img", "map", "-U", "--output=json", image)
	Expect(err).ToNot(HaveOccurred())
	var extents []struct {
		Start, Length int64
		Depth         int
		Data          bool
	}
	Expect(json.Unmarshal([]byte(out), &extents)).To(Succeed())
	first := int64(guestParams.StartLBA) * framework.SectorSize
	last := first + int64(guestParams.Sectors)*framework.SectorSize
	var n int64
	for _, e := range extents {
		if e.Depth != 0 || !e.Data {
			continue
		}
		lo, hi := max(e.Start, first), min(e.Start+e.Length, last)
		if hi > lo {
			n += hi - lo
		}
	}
	return n
}

func podUID(ctx context.Context, pod string) string {
	uid, err := kubectl(ctx, "-n", namespace, "get", "pod", pod, "-o", "jsonpath={.metadata.uid}")
	Expect(err).ToNot(HaveOccurred())
	return uid
}

// nodeLeftovers lists what the node still holds of a pod: its directory and
// mounts.
func nodeLeftovers(ctx context.Context, uid string) string {
	out, _ := inNode(ctx, "sh", "-c", fmt.Sprintf(
		"ls -d /var/lib/kubelet/pods/%[1]s 2>/dev/null; grep -F %[1]s /proc/self/mountinfo || true", uid))
	return strings.TrimSpace(out)
}

var _ = Describe("overlay volumes through the API", Ordered, func() {
	var golden, goldenSHA string

	BeforeAll(func(ctx SpecContext) {
		golden = goldenFilesystem(ctx, "golden-fs")
		var err error
		goldenSHA, err = framework.SHA256(golden)
		Expect(err).ToNot(HaveOccurred())
	})

	ephemeral := `
overlay:
  backingPVC: {claimName: golden-fs}
  backingFormat: raw`

	It("boots two VMs from ephemeral overlays over one golden claim, each writing only its own overlay", func(ctx SpecContext) {
		vms := []string{"ephemeral-a", "ephemeral-b"}
		for _, vm := range vms {
			Expect(apply(ctx, vmYAML(vm, "Always", ephemeral))).To(Succeed())
		}
		uids := map[string]string{}
		for _, vm := range vms {
			waitVMIReady(ctx, vm)
			status := waitGuestDone(ctx, vm)
			Expect(status.Written).To(Equal(guestParams.Sectors))
			pod := launcherPod(ctx, vm)
			uids[vm] = podUID(ctx, pod)
			// Every byte the guest wrote is in its own overlay.
			Expect(allocatedInTop(ctx, pod, ephemeralOverlay)).To(Equal(int64(guestParams.Sectors) * framework.SectorSize))
		}
		Expect(framework.SHA256(golden)).To(Equal(goldenSHA), "the golden image changed")

		for _, vm := range vms {
			deleteVM(ctx, vm)
			Eventually(func() string { return nodeLeftovers(ctx, uids[vm]) }).
				WithContext(ctx).WithTimeout(2 * time.Minute).Should(BeEmpty(), "the node still holds %s's pod", vm)
		}
		Expect(framework.SHA256(golden)).To(Equal(goldenSHA))
	})
})
