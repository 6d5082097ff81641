// Command gpu-device-plugin-standin is a STAND-IN for the NVIDIA device plugin (k8s-device-plugin v0.17.4), for
// the e2e suite's real node on machines without a GPU. It is a test fixture, not product.
//
// It speaks the kubelet's real device-plugin API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1): it serves
// DevicePlugin on a unix socket in the kubelet's device-plugins directory, Registers with kubelet.sock, streams its
// devices with ListAndWatch and answers Allocate. Its answers copy what the real plugin did on an NVIDIA H200
// (tests/e2e/README and the real-h200 fixtures):
//   - device ids are GPU UUIDs ("GPU-7499c50f-2307-cd9c-d9cc-937afc16d5cb");
//   - with --replicas N > 1 (time-slicing) every GPU is advertised as "<uuid>::0" ... "<uuid>::N-1";
//   - Allocate sets NVIDIA_VISIBLE_DEVICES to the UUIDs of the devices given (replica suffix removed);
//   - with --fail-requests-greater-than-one and time-slicing, a request for 2 replicas fails with the real
//     plugin's text: "invalid allocation request for "nvidia.com/gpu": invalid request: maximum request size for
//     shared resources is 1; found 2, which is unexpected".
//
// Health: every --health-poll it reads --unhealthy-file (one device id per line; a GPU UUID marks all its
// replicas) and sends the new list when it changes, as the real plugin does on an NVML XID event. SIGTERM or
// SIGINT removes its socket and exits; the kubelet then marks its devices unhealthy.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer

	resource      string
	uuids         []string
	replicas      int
	failOverOne   bool
	unhealthyFile string

	mu      sync.Mutex
	devices []*pluginapi.Device
	changed chan struct{}
}

func (p *plugin) deviceIDs() []string {
	var ids []string
	for _, uuid := range p.uuids {
		if p.replicas <= 1 {
			ids = append(ids, uuid)
			continue
		}
		for i := range p.replicas {
			ids = append(ids, fmt.Sprintf("%s::%d", uuid, i))
		}
	}
	return ids
}

func gpuOf(id string) string {
	uuid, _, _ := strings.Cut(id, "::")
	return uuid
}

// refresh rebuilds the device list from the unhealthy file; returns true when it changed.
func (p *plugin) refresh() bool {
	unhealthy := map[string]bool{}
	if p.unhealthyFile != "" {
		if data, err := os.ReadFile(p.unhealthyFile); err == nil {
			for _, line := range strings.Split(string(data), "\n") {
				if line = strings.TrimSpace(line); line != "" {
					unhealthy[line] = true
				}
			}
		}
	}
	var devices []*pluginapi.Device
	for _, id := range p.deviceIDs() {
		health := pluginapi.Healthy
		if unhealthy[id] || unhealthy[gpuOf(id)] {
			health = pluginapi.Unhealthy
		}
		devices = append(devices, &pluginapi.Device{ID: id, Health: health})
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	same := len(devices) == len(p.devices)
	for i := 0; same && i < len(devices); i++ {
		same = devices[i].ID == p.devices[i].ID && devices[i].Health == p.devices[i].Health
	}
	p.devices = devices
	return !same
}

func (p *plugin) snapshot() []*pluginapi.Device {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.devices)
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	for {
		devices := p.snapshot()
		log.Printf("ListAndWatch: sending %d devices: %s", len(devices), describe(devices))
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devices}); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-p.changed:
		}
	}
}

func describe(devices []*pluginapi.Device) string {
	parts := make([]string, 0, len(devices))
	for _, d := range devices {
		parts = append(parts, d.ID+"="+d.Health)
	}
	return strings.Join(parts, ",")
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, creq := range req.ContainerRequests {
		ids := creq.DevicesIds
		if p.replicas > 1 && p.failOverOne && len(ids) > 1 {
			err := fmt.Errorf("invalid allocation request for %q: invalid request: maximum request size for shared "+
				"resources is 1; found %d, which is unexpected", p.resource, len(ids))
			log.Printf("Allocate %v: %v", ids, err)
			return nil, err
		}
		var gpus []string
		for _, id := range ids {
			if uuid := gpuOf(id); !slices.Contains(gpus, uuid) {
				gpus = append(gpus, uuid)
			}
		}
		log.Printf("Allocate %v: NVIDIA_VISIBLE_DEVICES=%s", ids, strings.Join(gpus, ","))
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(gpus, ",")},
		})
	}
	return resp, nil
}

func (p *plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

func register(kubeletSocket, endpoint, resource string) error {
	conn, err := grpc.NewClient("unix://"+kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: endpoint, ResourceName: resource,
		Options: &pluginapi.DevicePluginOptions{},
	})
	return err
}

func main() {
	dir := flag.String("device-plugin-dir", pluginapi.DevicePluginPath, "the kubelet's device-plugins directory")
	resource := flag.String("resource", "nvidia.com/gpu", "the extended resource to advertise")
	uuids := flag.String("uuids", "GPU-7499c50f-2307-cd9c-d9cc-937afc16d5cb", "comma-separated GPU UUIDs (stand-in devices)")
	replicas := flag.Int("replicas", 1, "time-slicing replicas per GPU (1: whole GPUs)")
	failOverOne := flag.Bool("fail-requests-greater-than-one", false, "time-slicing: refuse requests for more than one replica")
	unhealthyFile := flag.String("unhealthy-file", "", "a file listing device ids (or GPU UUIDs) to report Unhealthy")
	healthPoll := flag.Duration("health-poll", 500*time.Millisecond, "how often to read --unhealthy-file")
	flag.Parse()

	p := &plugin{resource: *resource, replicas: *replicas, failOverOne: *failOverOne,
		unhealthyFile: *unhealthyFile, changed: make(chan struct{}, 1)}
	for _, u := range strings.Split(*uuids, ",") {
		if u = strings.TrimSpace(u); u != "" {
			p.uuids = append(p.uuids, u)
		}
	}
	if len(p.uuids) == 0 {
		log.Fatal("--uuids: give at least one GPU UUID")
	}
	p.refresh()

	endpoint := "nvidia-gpu-standin.sock"
	socket := filepath.Join(*dir, endpoint)
	_ = os.Remove(socket)
	listener, err := net.Listen("unix", socket)
	if err != nil {
		log.Fatalf("listen on %s: %v", socket, err)
	}
	server := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(server, p)
	go func() {
		if err := server.Serve(listener); err != nil {
			log.Fatalf("serve: %v", err)
		}
	}()
	if err := register(filepath.Join(*dir, "kubelet.sock"), endpoint, *resource); err != nil {
		_ = os.Remove(socket)
		log.Fatalf("register %s with the kubelet at %s: %v", *resource, filepath.Join(*dir, "kubelet.sock"), err)
	}
	log.Printf("registered %s with %d devices (stand-in for the NVIDIA device plugin)", *resource, len(p.deviceIDs()))

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	ticker := time.NewTicker(*healthPoll)
	defer ticker.Stop()
	for {
		select {
		case <-stop:
			server.Stop()
			_ = os.Remove(socket)
			log.Printf("stopped; removed %s", socket)
			return
		case <-ticker.C:
			if p.refresh() {
				select {
				case p.changed <- struct{}{}:
				default:
				}
			}
		}
	}
}
