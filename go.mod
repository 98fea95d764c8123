module github.com/kaas-go/kaas

go 1.26.8

require (
	github.com/VictoriaMetrics/metrics v1.45.0
	github.com/panjf2000/gnet/v2 v2.9.7
	github.com/twmb/franz-go v1.22.3
	github.com/twmb/franz-go/pkg/kadm v1.20.0
	github.com/twmb/franz-go/pkg/kmsg v1.15.1
	github.com/valyala/bytebufferpool v1.0.0
	go.uber.org/zap v1.28.0
	golang.org/x/sys v0.38.0
)

require (
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/panjf2000/ants/v2 v2.11.3 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/valyala/fastrand v1.1.0 // indirect
	github.com/valyala/histogram v1.2.0 // indirect
	github.com/xdg-go/scram v1.4.0 // indirect
	github.com/xdg-go/stringprep v1.0.4 // indirect
	go.uber.org/multierr v1.11.0 // indirect
	golang.org/x/sync v0.11.0 // indirect
	golang.org/x/text v0.3.8 // indirect
	gopkg.in/natefinch/lumberjack.v2 v2.2.1 // indirect
)
