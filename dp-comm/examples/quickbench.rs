fn main() {
    let mut c = dp_comm::BenchConfig::default();
    if let Some(a) = std::env::args().nth(1) { c.ranks = vec![a.parse().unwrap()]; }
    if let Some(a) = std::env::args().nth(2) { c.sizes = vec![a.parse::<usize>().unwrap() << 20]; }
    println!("{}", dp_comm::measure_all_reduce(&c).unwrap());
}
