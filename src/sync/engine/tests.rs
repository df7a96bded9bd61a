mod step_place_tests {
    use std::time::Duration;

    use super::super::{IN_PLACE_MAX, StepPlace};

    const SHORT: Duration = Duration::from_micros(20);

    #[test]
    fn outside_a_runtime_or_on_a_current_thread_every_step_runs_in_place() {
        for last in [None, Some(SHORT), Some(Duration::from_millis(113))] {
            assert_eq!(StepPlace::after(last), StepPlace::InPlace);
        }
        let current = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        current.block_on(async {
            assert_eq!(StepPlace::after(None), StepPlace::InPlace);
            assert_eq!(StepPlace::after(Some(IN_PLACE_MAX)), StepPlace::InPlace);
        });
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn on_workers_a_step_goes_off_them_until_measured_short() {
        assert_eq!(StepPlace::after(None), StepPlace::OffWorker, "not measured");
        assert_eq!(StepPlace::after(Some(SHORT)), StepPlace::InPlace);
        let just_under = IN_PLACE_MAX - Duration::from_nanos(1);
        assert_eq!(StepPlace::after(Some(just_under)), StepPlace::InPlace);
        assert_eq!(StepPlace::after(Some(IN_PLACE_MAX)), StepPlace::OffWorker);
        let at_10k_tenants = Duration::from_millis(113);
        assert_eq!(StepPlace::after(Some(at_10k_tenants)), StepPlace::OffWorker);
        // Both places run the step and hand back its result.
        assert_eq!(StepPlace::OffWorker.run(|| 7), 7);
        assert_eq!(StepPlace::InPlace.run(|| 8), 8);
    }
}

mod held {
    use super::super::own::held_figure;

    #[test]
    fn a_held_figure_is_rounded_up_to_a_sixteenth_of_l_and_never_above_it() {
        assert_eq!(held_figure(0, 100), 0, "nothing held: nothing published");
        assert_eq!(held_figure(1, 100), 6);
        assert_eq!(held_figure(13, 100), 18);
        assert_eq!(held_figure(99, 100), 100, "capped at L");
        assert_eq!(held_figure(13, 40), 14, "steps of 2");
        assert_eq!(held_figure(3, 10), 3, "L under 16: exact");
        assert_eq!(held_figure(120, 100), 120, "above a lowered L: as told");
    }
}
