// A GPT's token and position embedding and its gradients, as src/ops/embedding.rs. Ids come
// as floats (the model's input), checked on the host when the batch arrives. The table's
// gradient is a scatter: rather than atomics (whose order, and so whose sums, change from run
// to run), the host sorts the batch's rows by id (a stable sort of a few thousand ids) and
// one thread per (distinct id, feature) adds that id's rows of dy in order.

extern "C" {

// y[r, c] = table[ids[r], c] + positions[r % t, c] for `rows` rows of `dim`.
__global__ void dp_embedding(const float* ids, const float* table, const float* positions,
                             float* y, long long rows, long long t, long long dim) {
    DP_FOR_EACH(i, rows * dim) {
        long long r = i / dim, c = i % dim;
        long long id = (long long)ids[r];
        y[i] = table[id * dim + c] + positions[(r % t) * dim + c];
    }
}

// dpositions[p, c] = sum over the samples of dy[b * t + p, c]: written, or added with
// `accumulate`.
__global__ void dp_embedding_position_grad(const float* dy, float* dpositions, long long batch,
                                           long long t, long long dim, int accumulate) {
    DP_FOR_EACH(i, t * dim) {
        long long p = i / dim, c = i % dim;
        float sum = 0.0f;
        for (long long b = 0; b < batch; ++b) sum += dy[(b * t + p) * dim + c];
        dpositions[i] = accumulate ? dpositions[i] + sum : sum;
    }
}

// dtable[ids[s], c] += the sum of dy's rows order[starts[s]..starts[s + 1]] at column c: the
// rows holding distinct id number s, in ascending order (`order` is the batch's rows sorted
// by id, stably; `segment_ids[s]` their id).
__global__ void dp_embedding_table_grad(const float* dy, const long long* order,
                                        const long long* starts, const long long* segment_ids,
                                        float* dtable, long long segments, long long dim) {
    DP_FOR_EACH(i, segments * dim) {
        long long s = i / dim, c = i % dim;
        float sum = 0.0f;
        for (long long k = starts[s]; k < starts[s + 1]; ++k) sum += dy[order[k] * dim + c];
        dtable[segment_ids[s] * dim + c] += sum;
    }
}

}  // extern "C"
