"""`CudaPrefetchCallback` throughput against the pipeline bound: now the `prefetch` part of the GPU suite (`bench.gpu.prefetch`).

    python -m bench.prefetch --out DIR     # = python -m bench gpu --out DIR --parts prefetch
"""
import sys

def main(argv=None) -> int:
    from bench.gpu.suite import main as suite
    return suite(['--parts', 'prefetch', *(sys.argv[1:] if argv is None else argv)])

if __name__ == '__main__': sys.exit(main())
